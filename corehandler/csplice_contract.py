"""Which capture strategy csplice should use on this kernel (`strategy = "auto"` in the config).

The answer is measured, not assumed: bench/capture.py times how long each strategy holds a crashed process,
on the live kernel and behind the feeder's two paths, and bench/results/capture.md holds the table. Two kinds
of kernel matter, because they fill the core pipe differently:

- stock: the kernel copies every page into the pipe (`__kernel_write_iter()`);
- COREDUMP_USE_PIPE (the out-of-tree patch in ../shared/kernel/, tests/kernel/README.md): the kernel vmsplices
  the process's own pages into the pipe, so a handler that never copies them again (splice) saves the only
  copy left.

The per-kernel choice is for ordinary dumps. `direct` (O_DIRECT writes from a ring, two in flight) is chosen per
crash by csplice itself, from the process's VmRSS against capture.direct_above, and within a dump by rw when
its own write rate falls below capture.direct_rate; both are rendered from this host's measured write rates
(host/writerates.py): whether O_DIRECT or the page cache is faster is the host's and the moment's, not the
kernel's.

STRATEGIES is the Python side's one list of the strategy names; csplice's (strategy_table in
csplice/settings.c, printed by `csplice --list-strategies`) is compared with it by a test.
"""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from corehandler import units
from corehandler.errors import SystemFailure

STRATEGIES = ("rw", "splice", "rw2", "splice2", "direct")

# On a patched kernel vmsplice_to_pipe() is exported for the coredump code: a global text symbol. On a stock
# kernel it is static and inlined into the vmsplice syscall, so it is absent or a local 't'.
_PATCHED_SYMBOL = re.compile(rb"^[0-9a-f]+ T vmsplice_to_pipe$", re.MULTILINE)

# The choices and the measurements behind them: bench/results/capture.md (live stock 6.18 crashes: only
# read/write stayed at or below a plain read/write loop in every workload), bench/results/capture-feeder.md
# (the feeder's vmsplice path, i.e. a COREDUMP_USE_PIPE kernel: two-stage splice ahead) and
# bench/results/kernel.md (the real patched 6.1 kernel under qemu: two-stage splice fastest).
STOCK_KERNEL_STRATEGY = "rw"
PATCHED_KERNEL_STRATEGY = "splice2"


def kernel_vmsplices_cores(proc_root: Path = Path("/proc")) -> bool:
    """Whether the running kernel has the COREDUMP_USE_PIPE patch. An unreadable kallsyms reads as stock: the
    stock choice is never slow on a patched kernel, the other way round it can be."""
    try:
        text = (proc_root / "kallsyms").read_bytes()
    except OSError:
        return False
    return _PATCHED_SYMBOL.search(text) is not None


def choose_strategy(proc_root: Path = Path("/proc")) -> str:
    """The capture strategy bench/capture.py measured fastest for this kind of kernel."""
    return PATCHED_KERNEL_STRATEGY if kernel_vmsplices_cores(proc_root) else STOCK_KERNEL_STRATEGY


# The kernel's %-specifiers csplice takes, in csplice's argv order: the Python side's one copy of csplice's
# arg_names table (csplice/record.h), which `csplice --list-specifiers` prints and a test compares with these.
SPECIFIERS = "%P %i %I %u %g %d %s %t %c %h %e"


# %F, a pidfd of the crashed process, exists from Linux 6.16. Every pattern carries it, so the one the package's
# sysctl.d file sets at boot is the one install sets: an older kernel's format_corename expands a specifier it
# does not know to nothing (fs/coredump.c, `default: break`), which csplice reads as "no pidfd" in both shapes
# of argv the kernel makes of it: an empty last argument (5.7 on, split before expansion) or none (argv_split).
PIDFD_SPECIFIER = "%F"


# The steps of a hold that csplice traces into its record's capture.phases (record.c, write_phases): each one's
# end in ns after csplice's start, 0 where it did not happen; set-up in this order, then the copy's steps (rw's
# hand-off to direct maps its ring after the first byte), the release, the core's publishing. Beside them the record
# keeps capture.longest_read_ns and capture.longest_write_ns. bench/capture.py breaks its worst rounds down by
# them; a test holds a real record's keys to this list.
PHASES = ("settings", "metadata", "admitted", "created", "ring", "first_byte", "handoff", "eof", "released",
          "published")


def csplice_version(path: Path) -> str:
    try:
        result = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SystemFailure(f"cannot run {path} --version: {e}") from None
    if result.returncode != 0:
        raise SystemFailure(f"{path} --version failed with exit code {result.returncode}")
    return result.stdout.strip()



# --- csplice.conf: what the control plane tells csplice ----------------------------------------------------
# csplice reads `key=value` lines and ignores keys it does not know (csplice/settings.c), so the owner's two
# keys are words for the control plane only: which installation wrote the file, so a second writer knows it is
# one (host/handler.py).
OWNER_KEY = "owner"
INSTALLATION_KEY = "installation"
SETTINGS_HEADER = "# Generated by corehandler from its configuration; edit corehandler.toml instead."


@dataclass(frozen=True)
class Facts:
    """What this host measured, for the settings a config leaves at auto: the strategy for this kernel
    (choose_strategy) and the thresholds from the spool's write rates (host/writerates.py choose())."""
    strategy: str
    direct_above: int
    direct_rate: int


@dataclass(frozen=True)
class Owner:
    """The installation that wrote csplice.conf: its state dir and its installation id (None in a file an
    older version wrote, which named no owner: its spool_dir's parent is the owner then)."""
    state_dir: str
    installation: str | None


def _setting_value(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, units.SizeOrPercent):
        # csplice counts whole percents; rounding up keeps at least the configured share free.
        return f"{math.ceil(value.percent)}%" if value.percent is not None else str(value.bytes)
    if isinstance(value, float):  # a duration: csplice counts whole seconds, rounded up
        return str(math.ceil(value))
    return str(value)


def _one_line(key: str, value: str) -> str:
    if any(ord(c) < 32 or c == "\x7f" for c in value):
        raise ValueError(f"csplice.conf: {key} must be one line without control characters: {value!r}")
    return f"{key}={value}"


def settings_values(capture, spool_dir: Path, facts: Facts) -> dict[str, str]:
    """csplice.conf's keys and values: every option of capture (the config's [capture] model) under its own
    name, and the spool csplice writes into; auto settled by this host's facts."""
    settings = {"spool_dir": str(spool_dir)}
    settings |= {name: _setting_value(getattr(capture, name)) for name in type(capture).model_fields}
    if capture.strategy == "auto":
        settings["strategy"] = facts.strategy
        if capture.direct_above == "auto":
            settings["direct_above"] = str(facts.direct_above)
        if capture.direct_rate == "auto":
            settings["direct_rate"] = str(facts.direct_rate)
    else:
        # An explicit strategy is used for every dump, whole; only auto also chooses by the process's size and
        # its own write rate.
        settings["direct_above"] = settings["direct_rate"] = "0"
    return settings


def render_settings(capture, spool_dir: Path, facts: Facts, owner: Owner | None = None,
                    overrides: Mapping[str, str] | None = None) -> str:
    """csplice.conf, the one renderer: the settings, then the owner. overrides (benchmarks and tests that pin
    a strategy or a size) replace values of the same keys."""
    values = settings_values(capture, spool_dir, facts)
    values |= {key: _setting_value(value) for key, value in (overrides or {}).items()}
    lines = [SETTINGS_HEADER, f"# capture.strategy = {capture.strategy}"]
    lines += [_one_line(key, str(value)) for key, value in values.items()]
    if owner is not None:
        lines.append(_one_line(OWNER_KEY, owner.state_dir))
        if owner.installation:
            lines.append(_one_line(INSTALLATION_KEY, owner.installation))
    return "\n".join(lines) + "\n"


def builtin_facts(program: Path) -> Facts:
    """What csplice uses for the auto settings when csplice.conf leaves them out (`csplice --list-settings`): a
    file rendered on these runs as csplice's built-ins would (tests and benchmarks that pin a few keys)."""
    try:
        listed = subprocess.run([str(program), "--list-settings"], capture_output=True, text=True, check=True,
                                timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise SystemFailure(f"cannot run {program} --list-settings: {e}") from None
    values = parse_settings(listed)
    return Facts(values["strategy"], int(values["direct_above"]), int(values["direct_rate"]))


def parse_settings(text: str) -> dict[str, str]:
    """csplice.conf's key=value lines as csplice reads them (comments and blank lines skipped)."""
    values = {}
    for line in text.splitlines():
        line = line.lstrip(" \t")
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key] = value
    return values


def settings_owner(text: str) -> Owner | None:
    """Who wrote this csplice.conf: its owner keys, or for a file without them (v0.3) the parent of the spool it
    names; None when it names neither."""
    values = parse_settings(text)
    if values.get(OWNER_KEY):
        return Owner(values[OWNER_KEY], values.get(INSTALLATION_KEY) or None)
    spool = values.get("spool_dir")
    return Owner(str(Path(spool).parent), None) if spool else None
