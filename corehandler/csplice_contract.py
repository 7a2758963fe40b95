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

import re
import subprocess
from pathlib import Path

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


# %F, a pidfd of the crashed process, exists from Linux 6.16; older kernels would pass it through literally.
PIDFD_SPECIFIER = "%F"


PIDFD_SINCE = (6, 16)


def csplice_version(path: Path) -> str:
    try:
        result = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SystemFailure(f"cannot run {path} --version: {e}") from None
    if result.returncode != 0:
        raise SystemFailure(f"{path} --version failed with exit code {result.returncode}")
    return result.stdout.strip()

