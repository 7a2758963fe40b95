"""How long does the mini core (corehandler/analysis/minicore.py) take to write, by thread count, from a big core?

Cores: real crashes of tests/support/analysed.c (`threads N MIB`: N-1 idle threads with 64 KiB stacks, MIB
MiB written, main crashes), cored by gdb's gcore (nothing global changed), so 1, 64 and 500 threads each in
a core of about MIB MiB. Per core and round, rounds interleaved, minicore.write() with the daemon's default
caps into a directory beside the cores (the store's filesystem in the daemon: the raw core and the mini core
share it), once with the raw core in the page cache (warm: as the daemon finds it after compressing it) and
once with it dropped from the page cache (cold: POSIX_FADV_DONTNEED after an fsync). Each time is split into
its fsync (the mini core made durable) and the rest (headers, notes, choosing and copying the pages).

    python -P bench/minicore.py [--rounds 5] [--mib 1024] [--threads 1,64,500] [--out bench/results/minicore.md]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import common  # noqa: E402
from common import describe_cache, machine, markdown_table, median, page_cache_state  # noqa: E402

from corehandler.analysis import minicore  # noqa: E402
from support import realcore  # noqa: E402

# Issue 37: a mini core of 500 threads, warm or cold, in at most this long.
GOAL_MS = 50
_fsync_seconds = 0.0
_real_fsync = os.fsync


def _timed_fsync(fd: int) -> None:
    global _fsync_seconds
    started = time.monotonic()
    _real_fsync(fd)
    _fsync_seconds += time.monotonic() - started


def drop_from_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _real_fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def write_once(core: Path, dest: Path) -> tuple[float, float, minicore.MiniCore]:
    """(seconds in all, of which in fsync, the mini core)."""
    global _fsync_seconds
    _fsync_seconds = 0.0
    started = time.monotonic()
    mini = minicore.write(core, dest)
    total = time.monotonic() - started
    dest.unlink()
    return total, _fsync_seconds, mini


def ms(values: list[float]) -> str:
    return f"{median(values) * 1e3:.1f} ({min(values) * 1e3:.1f}-{max(values) * 1e3:.1f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--threads", default="1,64,500")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "minicore.md")
    args = ap.parse_args()
    counts = [int(x) for x in args.threads.split(",") if x]
    os.fsync = _timed_fsync  # minicore calls os.fsync: timed here, nothing else changes
    with tempfile.TemporaryDirectory(prefix="bench-minicore-", dir="/var/tmp") as tmpdir:
        tmp = Path(tmpdir)
        binary = realcore.build(tmp, name="analysed")
        cores = {n: realcore.crash(binary, tmp / f"core.{n}", "threads", str(n - 1), str(args.mib), timeout=900)
                 for n in counts}
        before = page_cache_state()
        samples = {n: {k: [] for k in ("warm", "warm fsync", "cold", "cold fsync")} for n in counts}
        minis: dict[int, minicore.MiniCore] = {}
        for _ in range(args.rounds):
            for n, c in cores.items():
                for kind in ("warm", "cold"):
                    if kind == "cold":
                        drop_from_cache(c.core)
                    else:  # the pages the mini core reads, back in the cache
                        minicore.write(c.core, tmp / "warmup").path.unlink()
                    total, fsync, minis[n] = write_once(c.core, tmp / "mini")
                    samples[n][kind].append(total)
                    samples[n][f"{kind} fsync"].append(fsync)
        after = page_cache_state()
        rows = []
        for n, c in cores.items():
            s, m = samples[n], minis[n]
            rows.append([str(m.threads), f"{c.core.stat().st_size / 2**20:.0f}", f"{m.bytes / 1024:.0f}",
                         f"{m.bytes / 1024 / max(1, m.threads):.1f}", str(m.segments), ms(s["warm"]),
                         ms(s["warm fsync"]), ms(s["cold"]), ms(s["cold fsync"]),
                         "yes" if max(s["warm"] + s["cold"]) * 1e3 <= GOAL_MS else "no"])
    table = markdown_table(["threads", "core MiB", "mini KiB", "KiB/thread", "segments", "warm ms", "of it fsync",
                            "cold ms", "of it fsync", f"worst ≤ {GOAL_MS} ms (goal)"], rows)
    text = (f"# Mini core: write time and size by thread count\n\n"
            f"`python -P bench/minicore.py --rounds {args.rounds} --mib {args.mib} --threads {args.threads}`, "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC.\n\n"
            f"Machine: {machine()}; /var/tmp on {common.filesystem_of(Path('/var/tmp'))}.\n"
            f"Before: {describe_cache(before)}. After: {describe_cache(after)}.\n"
            f"Times: median (min-max) of {args.rounds} interleaved rounds; warm = the raw core in the page cache, "
            f"cold = dropped from it; \"of it fsync\" = the mini core's fsync within that time.\n\n" + table)
    common.publish(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
