"""Human units in the configuration: sizes ("4G", "512K", "1.5GiB", 4096), durations ("2w", "1h30m", "90s",
"0") and percentages ("15%"). Parsing is strict: anything ambiguous or out of range is an error that says
what was expected, never a guess.

Sizes are binary (1K = 1024), as in systemd's and the kernel's conventions; "KB"/"MB" are refused because
half of their readers would take them for powers of ten.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

# Sizes go into SQLite and C uint64 fields; staying below 2^63 keeps them exact everywhere.
MAX_SIZE = 2**63 - 1
# Far beyond any sensible retention age, and small enough that seconds stay exact as floats.
MAX_DURATION = 1000 * 365 * 86400.0

_SIZE_UNITS = {"": 1, "b": 1}
for _i, _letter in enumerate("kmgtpe", start=1):
    _SIZE_UNITS[_letter] = 1024**_i
    _SIZE_UNITS[_letter + "ib"] = 1024**_i
_FORMAT_UNITS = [(1024**i, "KMGTPE"[i - 1]) for i in range(6, 0, -1)]

# Largest first: a duration's parts must come in this order, each at most once ("1h30m", not "30m1h").
_DURATION_UNITS = [("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1), ("ms", Fraction(1, 1000))]
# systemd.time(7)'s longer units (a year of 365.25 days, a month of 30.44), parsed but never written.
_LONG_UNITS = [("y", 31557600), ("month", 2629800)]
_DURATION_ALIASES = {"min": "m", "sec": "s",
                     # systemd.time(7)'s spellings
                     "years": "y", "year": "y", "months": "month", "weeks": "w", "week": "w", "days": "d",
                     "day": "d", "hours": "h", "hour": "h", "hr": "h", "minutes": "m", "minute": "m",
                     "seconds": "s", "second": "s", "msec": "ms"}

_NUMBER = r"(\d+(?:\.\d+)?)"
_SIZE_RE = re.compile(rf"{_NUMBER}\s*([a-zA-Z]*)")
_DURATION_PART_RE = re.compile(rf"{_NUMBER}\s*([a-z]+)\s*")


class UnitError(ValueError):
    """A value that does not parse as the unit expected; the message says what would."""


def _reject_bool(value, what: str) -> None:
    # bool is an int in Python; `max_dump_size = true` is a mistake, not 1 byte.
    if isinstance(value, bool):
        raise UnitError(f"expected {what}, got a boolean")


def parse_size(value: str | int) -> int:
    """Bytes from a size: a non-negative integer, or a string like "4G", "512K", "1.5GiB", "100"."""
    _reject_bool(value, "a size")
    if isinstance(value, int):
        number, multiplier, text = Decimal(value), 1, str(value)
    elif isinstance(value, str):
        text = value.strip()
        m = _SIZE_RE.fullmatch(text)
        if text.startswith("-"):
            raise UnitError(f"{value!r} is negative; sizes are 0 or more")
        if not m:
            raise UnitError(f"{value!r} is not a size: expected a number of bytes or a number with K, M, G, T, P "
                            f"or E (binary: 1K = 1024), e.g. \"4G\"")
        unit = m.group(2).lower()
        if unit not in _SIZE_UNITS:
            hint = f"; use {unit[0].upper()} or {unit[0].upper()}iB (1024-based)" if unit[1:] == "b" else ""
            raise UnitError(f"{value!r} has an unknown size unit {m.group(2)!r}{hint}")
        number, multiplier = Decimal(m.group(1)), _SIZE_UNITS[unit]
        if multiplier == 1 and number != number.to_integral_value():
            raise UnitError(f"{value!r} is a fraction of a byte")
    else:
        raise UnitError(f"expected a size (an integer or a string like \"4G\"), got {type(value).__name__}")
    if number < 0:
        raise UnitError(f"{text!r} is negative; sizes are 0 or more")
    size = int(number * multiplier)
    if size > MAX_SIZE:
        raise UnitError(f"{text!r} is too large (at most {MAX_SIZE} bytes)")
    return size


def format_size(size: int) -> str:
    """The shortest exact form: 65536 -> "64K", 1536 -> "1536". parse_size(format_size(n)) == n."""
    for multiplier, letter in _FORMAT_UNITS:
        if size >= multiplier and size % multiplier == 0:
            return f"{size // multiplier}{letter}"
    return str(size)


def human_size(size: int) -> str:
    """An approximate form for people: 1610612736 -> "1.5G", 1000 -> "1000B"."""
    for multiplier, letter in _FORMAT_UNITS:
        if size >= multiplier:
            return f"{size / multiplier:.1f}".removesuffix(".0") + letter
    return f"{size}B"


def parse_duration(value: str | int | float) -> float:
    """Seconds from a duration: a number of seconds, or parts largest first: "2w", "1h30m", "90s", "250ms"."""
    _reject_bool(value, "a duration")
    if isinstance(value, (int, float)):
        seconds, text = value, str(value)
    elif isinstance(value, str):
        text = value.strip()
        if text.startswith("-"):
            raise UnitError(f"{value!r} is negative; durations are 0 or more")
        if not text:
            raise UnitError("an empty string is not a duration: write \"0\" for none")
        if re.fullmatch(_NUMBER, text):
            seconds = Fraction(Decimal(text))
        else:
            seconds = _parse_duration_parts(value, text)
    else:
        raise UnitError(f"expected a duration (seconds, or a string like \"1h30m\"), got {type(value).__name__}")
    if isinstance(seconds, float) and not math.isfinite(seconds):
        raise UnitError(f"{text!r} is not a finite duration")
    if seconds < 0:
        raise UnitError(f"{text!r} is negative; durations are 0 or more")
    if seconds > MAX_DURATION:
        raise UnitError(f"{text!r} is too long (at most {int(MAX_DURATION)} seconds)")
    return float(seconds)


def _parse_duration_parts(value: str, text: str) -> Fraction:
    order = [unit for unit, _ in _LONG_UNITS + _DURATION_UNITS]
    factors = dict(_LONG_UNITS + _DURATION_UNITS)
    total, pos, last = Fraction(0), 0, -1
    while pos < len(text):
        m = _DURATION_PART_RE.match(text, pos)
        if not m:
            raise UnitError(f"{value!r} is not a duration: expected seconds or parts like \"2w\", \"1h30m\", "
                            f"\"90s\", \"7days\" (units y, month, w, d, h, m, s, ms)")
        unit = _DURATION_ALIASES.get(m.group(2), m.group(2))
        if unit not in factors:
            raise UnitError(f"{value!r} has an unknown duration unit {m.group(2)!r} (units: y, month, w, d, h, "
                            "m, s, ms, or their systemd.time(7) names)")
        index = order.index(unit)
        if index <= last:
            raise UnitError(f"{value!r}: duration parts must go from largest to smallest unit, each once")
        last = index
        total += Fraction(Decimal(m.group(1))) * factors[unit]
        pos = m.end()
    return total


def format_duration(seconds: float) -> str:
    """A readable exact form: 5400 -> "1h30m", 0 -> "0", 0.25 -> "250ms". Round-trips through parse_duration
    for whole milliseconds; other fractions come out as plain seconds."""
    if seconds == 0:
        return "0"
    millis = Fraction(seconds) * 1000
    if millis.denominator != 1:
        return format(Decimal(repr(float(seconds))), "f")
    rest, parts = int(millis), []
    for unit, factor in _DURATION_UNITS:
        count, rest = divmod(rest, int(factor * 1000))
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def parse_percent(value: str) -> float:
    """A percentage from "15%" or "2.5%", between 0 and 100."""
    if not isinstance(value, str) or not re.fullmatch(rf"{_NUMBER}\s*%", value.strip()):
        raise UnitError(f"{value!r} is not a percentage like \"15%\"")
    percent = float(value.strip()[:-1])
    if percent > 100:
        raise UnitError(f"{value!r} is more than 100%")
    return percent


def format_percent(percent: float) -> str:
    short = f"{percent:g}"
    return f"{short if float(short) == percent and 'e' not in short else format(Decimal(repr(percent)), 'f')}%"


@dataclass(frozen=True)
class SizeOrPercent:
    """An absolute size or a share of a filesystem ("2G" or "15%"), resolved once the total is known."""

    bytes: int | None = None
    percent: float | None = None

    def __post_init__(self):
        if (self.bytes is None) == (self.percent is None):
            raise ValueError("SizeOrPercent holds exactly one of bytes and percent")

    @classmethod
    def parse(cls, value: str | int) -> SizeOrPercent:
        if isinstance(value, str) and value.strip().endswith("%"):
            return cls(percent=parse_percent(value))
        try:
            return cls(bytes=parse_size(value))
        except UnitError as e:
            raise UnitError(f"{e} (or a percentage like \"15%\")") from None

    def resolve(self, total_bytes: int) -> int:
        """Bytes: the size itself, or the percentage of total_bytes rounded down."""
        if self.bytes is not None:
            return self.bytes
        return int(total_bytes * Fraction(repr(self.percent)) / 100)

    def __str__(self) -> str:
        return format_size(self.bytes) if self.bytes is not None else format_percent(self.percent)
