"""Which capture strategy csplice should use on this kernel (`strategy = "auto"` in the config).

The answer is measured, not assumed: bench/capture.py times how long each strategy holds a crashed process,
on the live kernel and behind the feeder's two paths, and bench/results/capture.md holds the table. Two kinds
of kernel matter, because they fill the core pipe differently:

- stock: the kernel copies every page into the pipe (`__kernel_write_iter()`);
- COREDUMP_USE_PIPE (the seed's patch): the kernel vmsplices the process's own pages into the pipe, so a
  handler that never copies them again (splice) saves the only copy left.

The per-kernel choice is for ordinary dumps. `direct` (O_DIRECT writes from a reader/writer ring) is chosen per
crash by csplice itself, from the process's VmRSS against capture.direct_above: big dumps written through the
page cache wait for page allocation and reclaim (bench/results/capture.md).
"""

from __future__ import annotations

import re
from pathlib import Path

STRATEGIES = ("rw", "splice", "rw2", "splice2", "direct")

# On a patched kernel vmsplice_to_pipe() is exported for the coredump code: a global text symbol. On a stock
# kernel it is static and inlined into the vmsplice syscall, so it is absent or a local 't'.
_PATCHED_SYMBOL = re.compile(rb"^[0-9a-f]+ T vmsplice_to_pipe$", re.MULTILINE)

# Measured by bench/capture.py on Linux 6.18, 2 CPUs, ext4, with the config's 256K chunk and 1M pipe:
# - stock kernel (bench/results/capture.md, live crashes of 256 MiB and 1 GiB, dense and half untouched):
#   read/write held the process 0.71-0.98x as long as a plain read/write loop on a quiet machine (0.68-0.78x
#   in an earlier run under load); the seed's 16-page splice loop 1.3-2.0x (0.84-1.02x under load); two-stage
#   splice 0.77-0.98x (0.87-1.15x under load), two-thread read/write 1.2-3.2x (erratic on two cores). Only
#   read/write stayed at or below the loop in every workload of every run.
# - COREDUMP_USE_PIPE kernel (the feeder's vmsplice path: the kernel no longer copies the pages): two-stage
#   splice 0.48-0.50x the loop against read/write's 0.59-0.60x (bench/results/capture-feeder.md, and the
#   quiet run in capture.md); one run under load had them the other way round (0.92x, 0.80x). Under qemu,
#   on the real patched 6.1 kernel, two-stage splice with 1 MiB pipes was the fastest csplice configuration
#   in every run (bench/results/kernel.md). The seed's probes also had it ahead there, by 13%.
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
