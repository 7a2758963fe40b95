"""Human units: exact parsing, strict refusals, round-trips."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corehandler.units import (
    MAX_DURATION,
    MAX_SIZE,
    SizeOrPercent,
    UnitError,
    format_duration,
    format_percent,
    format_size,
    human_size,
    parse_duration,
    parse_percent,
    parse_size,
)

K, M, G, T = 1024, 1024**2, 1024**3, 1024**4


@pytest.mark.parametrize("text, expected", [
    ("0", 0), (0, 0), ("4096", 4096), (4096, 4096), ("4G", 4 * G), ("4g", 4 * G), ("512K", 512 * K),
    ("512KiB", 512 * K), ("1.5GiB", 3 * G // 2), ("1.5G", 3 * G // 2), (" 64 M ", 64 * M), ("2T", 2 * T),
    ("1E", 1024**6), ("100B", 100), ("0.5K", 512),
    # Fractions of a unit round down to whole bytes.
    ("0.1K", 102), ("1.0001K", 1024),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text, message", [
    ("4KB", "use K or KiB"), ("4MB", "use M or MiB"), ("1.5", "fraction of a byte"), ("-1", "negative"),
    (-1, "negative"), ("", "not a size"), ("G", "not a size"), ("4X", "unknown size unit"), ("1e3", "not a size"),
    ("4 G B", "not a size"), ("8E", "too large"), (2**63, "too large"), (True, "boolean"), (1.5, "got float"),
    (None, "got NoneType"), ("15%", "not a size"),
])
def test_parse_size_refuses(text, message):
    with pytest.raises(UnitError, match=message):
        parse_size(text)


@given(st.integers(min_value=0, max_value=MAX_SIZE))
def test_size_round_trip(n):
    text = format_size(n)
    assert parse_size(text) == n
    assert len(text) <= len(str(n))


@given(st.integers(min_value=0, max_value=2**30), st.sampled_from(["K", "M", "G", "KiB", "MiB", "GiB"]))
def test_size_with_unit_is_exact_multiple(n, unit):
    factor = {"K": K, "M": M, "G": G}[unit[0]]
    assert parse_size(f"{n}{unit}") == n * factor


def test_human_size():
    assert human_size(0) == "0B"
    assert human_size(1000) == "1000B"
    assert human_size(3 * G // 2) == "1.5G"
    assert human_size(64 * K) == "64K"


@pytest.mark.parametrize("text, expected", [
    ("0", 0.0), (0, 0.0), ("90", 90.0), (90, 90.0), (1.5, 1.5), ("90s", 90.0), ("2w", 14 * 86400.0),
    ("1h30m", 5400.0), ("1h 30min", 5400.0), ("1d2h3m4s5ms", 93784.005), ("250ms", 0.25), ("1.5h", 5400.0),
    (" 10 s ", 10.0), ("5sec", 5.0),
])
def test_parse_duration(text, expected):
    assert parse_duration(text) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("text, message", [
    ("30m1h", "largest to smallest"), ("1h1h", "largest to smallest"), ("1fortnight", "unknown duration unit"),
    ("-5", "negative"), (-5, "negative"), ("", "empty string"), ("h", "not a duration"), ("1h30", "not a duration"),
    ("5 moons", "unknown duration unit"), (True, "boolean"), (math.inf, "finite"), (math.nan, "finite"),
    ("100000w", "too long"), ([1], "got list"),
])
def test_parse_duration_refuses(text, message):
    with pytest.raises(UnitError, match=message):
        parse_duration(text)


@given(st.integers(min_value=0, max_value=int(MAX_DURATION) * 1000))
def test_duration_round_trip_whole_milliseconds(millis):
    seconds = millis / 1000
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, abs=1e-9)


@given(st.floats(min_value=0, max_value=MAX_DURATION, allow_nan=False))
def test_duration_round_trip_any(seconds):
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, rel=1e-12, abs=1e-9)


def test_format_duration():
    assert format_duration(0) == "0"
    assert format_duration(5400) == "1h30m"
    assert format_duration(14 * 86400) == "2w"
    assert format_duration(0.25) == "250ms"
    assert format_duration(90) == "1m30s"


@pytest.mark.parametrize("text, expected", [("15%", 15.0), ("0%", 0.0), ("100%", 100.0), ("2.5 %", 2.5)])
def test_parse_percent(text, expected):
    assert parse_percent(text) == expected


@pytest.mark.parametrize("text", ["101%", "-1%", "15", "%", "abc%", 15])
def test_parse_percent_refuses(text):
    with pytest.raises(UnitError):
        parse_percent(text)


@given(st.floats(min_value=0, max_value=100, allow_nan=False))
def test_percent_round_trip(p):
    assert parse_percent(format_percent(p)) == p


def test_size_or_percent():
    assert SizeOrPercent.parse("15%").resolve(1000) == 150
    assert SizeOrPercent.parse("15%").resolve(999) == 149  # rounds down
    assert SizeOrPercent.parse("2G").resolve(10) == 2 * G
    assert SizeOrPercent.parse(4096) == SizeOrPercent(bytes=4096)
    assert str(SizeOrPercent.parse("2G")) == "2G"
    assert str(SizeOrPercent.parse("12.5%")) == "12.5%"
    with pytest.raises(UnitError, match="or a percentage"):
        SizeOrPercent.parse("lots")
    with pytest.raises(ValueError):
        SizeOrPercent(bytes=1, percent=1.0)


@given(st.integers(min_value=0, max_value=2**62), st.floats(min_value=0, max_value=100, allow_nan=False))
def test_percent_resolves_within_total(total, p):
    resolved = SizeOrPercent(percent=p).resolve(total)
    assert 0 <= resolved <= total
    assert SizeOrPercent(percent=100.0).resolve(total) == total
