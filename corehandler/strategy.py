"""Which capture strategy csplice uses when the config says "auto".

Placeholder in branch `control` only: branch `capture` owns this module and replaces it with the choice its
benchmarks settle (per kernel). Until then "rw", the read()/write() loop that the probes in issue 2 found
fastest on a stock kernel, which is also csplice's built-in default.
"""

from __future__ import annotations

from pathlib import Path


def choose_strategy(proc_root: Path) -> str:
    return "rw"
