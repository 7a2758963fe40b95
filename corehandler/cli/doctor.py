"""doctor: what the running kernel offers a dump handler, found by reading and measuring (host/kernelprobe.py)."""

from __future__ import annotations

import argparse
import time

from corehandler import units
from corehandler.cli.common import base_paths, emit, load
from corehandler.errors import ConfigError
from corehandler.host import kernelprobe, writerates


def register(commands) -> None:
    parser = commands.add("doctor", run_doctor, help="which dump-relevant features the running kernel has, by "
                          "reading and measuring (changes nothing)")
    parser.add_argument("--probe", action="store_true",
                        help="also crash a throw-away process through a temporary core_pattern (restored "
                        "afterwards; needs root) to see %%F and COREDUMP_USE_PIPE at work")


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return " ".join(map(str, value))
    return str(value)


def capture_choice(paths) -> dict:
    """What csplice.conf's direct_above is rendered from: the spool's write rates as last measured (install and
    the daemon's start measure them; doctor only reads), and the choice they make."""
    measured = writerates.load(paths)
    described = writerates.describe(measured)
    detail = described.pop("reason")
    if measured is not None:
        stale = "" if writerates.is_current(measured, paths) else ", out of date: the daemon's next start measures"
        detail += f" (measured {time.strftime('%Y-%m-%d %H:%M', time.localtime(measured.measured_at))}{stale})"
    return {**kernelprobe.finding("capture_direct_above", units.format_size(described["direct_above"]),
                                  "read" if measured else "not measured", detail), **described}


def run_doctor(args: argparse.Namespace) -> int:
    try:
        paths = load(args)[1]  # the state dir the daemon measures in, which the config may move
    except ConfigError:
        paths = base_paths(args)  # doctor's kernel findings need no config
    found = kernelprobe.survey(probe=args.probe) + [capture_choice(paths)]
    width = max(len(f["name"]) for f in found)
    lines = [f"{f['name']:<{width}}  {_cell(f['value']):<14} {f['how']:<10} {f['detail']}" for f in found]
    emit(args, found, "\n".join(lines))
    return 0
