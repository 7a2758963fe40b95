"""doctor: what the running kernel offers a dump handler, found by reading and measuring (host/kernelprobe.py)."""

from __future__ import annotations

import argparse

from corehandler.cli.common import base_paths, emit
from corehandler.host import kernelprobe


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


def run_doctor(args: argparse.Namespace) -> int:
    paths = base_paths(args)
    found = kernelprobe.survey(probe=args.probe, proc_root=paths.proc_root)
    width = max(len(f["name"]) for f in found)
    lines = [f"{f['name']:<{width}}  {_cell(f['value']):<14} {f['how']:<10} {f['detail']}" for f in found]
    emit(args, found, "\n".join(lines))
    return 0
