"""What does storing a dump cost after csplice has released the crashed process, and how long until it is
listed?

1. Real kernel cores (root; takes the core_pattern lock and restores everything): the crasher dies through
   core_pattern into csplice and its cores are kept: dense (every page written), sparse (half the region never
   touched) and a typical program (a Python interpreter dying of SIGSEGV). Each is stored as the daemon does
   (compress.store_file: zstd, temp file, fsync, rename) at levels 1/3/6 with 1 and 2 threads; medians of
   --runs runs, speed also as a ratio against level 1 with one thread paired run by run.
2. Crash to indexed: `corehandler serve` running with the default config (strategy auto), a crasher dies; the
   clock starts at the crash trigger and stops when `corehandler list` would show the dump (its index row
   exists). The hold (the kernel holding the crashed process: trigger to reaping) is measured in the same run,
   and, alternating with it, systemd-coredump's hold of the same crash with its default Compress=yes (its own
   store and journald in a private mount namespace, bench/sdcd.py; --no-systemd-coredump skips it).

    python -P bench/compress.py [--runs 3] [--dense-mib 256] [--indexed-mib 256 1024 4096] [--no-compression]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from common import (  # noqa: E402
    describe_cache,
    filesystem_of,
    machine,
    markdown_table,
    median,
    page_cache_state,
    paired_ratio,
    plot_holds,
)
from sdcd import systemd_coredump  # noqa: E402

from corehandler import paths  # noqa: E402
from corehandler.csplice_contract import SPECIFIERS  # noqa: E402
from corehandler.store import compress  # noqa: E402
from support.crash import build_crasher  # noqa: E402
from support.host_core import host_core_settings  # noqa: E402
from support.waiting import wait_for  # noqa: E402

MiB = 1 << 20
LEVELS = (1, 3, 6)
THREADS = (1, 2)
WORK = Path("/tmp/daemon-bench")


def _allow_core():
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def csplice_conf(spool: Path) -> str:
    spool.mkdir(mode=0o700, parents=True, exist_ok=True)
    return "".join(f"{k}={v}\n" for k, v in {"spool_dir": spool, "max_pending": 0, "max_per_exe_per_minute": 0,
                                               "min_free": 0, "strategy": "rw"}.items())


def set_pattern(pattern: str) -> None:
    Path("/proc/sys/kernel/core_pattern").write_text(pattern)
    Path("/proc/sys/kernel/core_pipe_limit").write_text("16")


def timed_crash(argv: list[str]) -> tuple[float, float]:
    """Runs a crasher with --wait; returns (monotonic time of the trigger, seconds until it was reaped)."""
    proc = subprocess.Popen(argv + ["--wait"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            preexec_fn=_allow_core)
    proc.stdout.readline()  # "region ...": memory is filled, the crash is one newline away
    t0 = time.monotonic()
    proc.stdin.write(b"\n")
    proc.stdin.flush()
    _, status, _ = os.wait4(proc.pid, 0)
    t1 = time.monotonic()
    proc.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    if proc.returncode >= 0:
        raise RuntimeError(f"{argv} did not crash (exit {proc.returncode})")
    return t0, t1 - t0


def wait_records(spool: Path, n: int, timeout: float = 120) -> list[dict]:
    def committed():
        names = sorted(x for x in os.listdir(spool) if x.endswith(".json") and not x.startswith("."))
        return names if len(names) >= n else None

    names = wait_for(committed, timeout, f"{n} records in {spool}", interval=0.01)
    return [json.loads((spool / x).read_text()) for x in names]


# -- 1. compression of real cores ----------------------------------------------------------------------------

def capture_cores(crasher: Path, dense_mib: int) -> dict[str, Path]:
    spool, cores = WORK / "capture" / "spool", WORK / "cores"
    shutil.rmtree(WORK / "capture", ignore_errors=True)
    cores.mkdir(parents=True, exist_ok=True)
    paths.CSPLICE_SETTINGS.write_text(csplice_conf(spool))
    set_pattern(f"|{paths.csplice_path()} {SPECIFIERS}")
    kinds = {"dense": [str(crasher), "segv", str(dense_mib)],
             "sparse": [str(crasher), "segv", str(dense_mib * 2), "--untouched-half"],
             "typical (python3)": ["python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]}
    out = {}
    for i, (kind, argv) in enumerate(kinds.items()):
        subprocess.run(argv, capture_output=True, preexec_fn=_allow_core)
        record = wait_records(spool, i + 1)[-1]
        target = cores / f"{kind.split()[0]}.core"
        os.replace(spool / record["core"], target)
        out[kind] = target
    return out


def bench_compression(cores: dict[str, Path], runs: int) -> str:
    store = WORK / "store"
    store.mkdir(parents=True, exist_ok=True)
    rows = []
    for kind, core in cores.items():
        raw = core.stat().st_size
        alloc = core.stat().st_blocks * 512
        seconds: dict[tuple, list[float]] = {}
        stored: dict[tuple, int] = {}
        compress.store_file(core, store, "bench").path.unlink()  # warm-up: page cache, allocator
        for _ in range(runs):
            for level in LEVELS:
                for threads in THREADS:
                    s = compress.store_file(core, store, "bench", level=level, threads=threads)
                    seconds.setdefault((level, threads), []).append(s.seconds)
                    stored[(level, threads)] = s.stored_bytes
                    s.path.unlink()
        base = seconds[(1, 1)]
        for (level, threads), secs in seconds.items():
            rows.append([kind, f"{raw / MiB:.0f} MiB ({alloc / MiB:.0f} allocated)", level, threads,
                         raw / median(secs) / MiB, raw / stored[(level, threads)],
                         paired_ratio(base, secs)])
    return markdown_table(["core", "size", "level", "threads", "MiB/s (median)", "ratio raw/stored",
                           "speed vs level 1, 1 thread"], rows)


# -- 2. crash to indexed ------------------------------------------------------------------------------------

def index_count(index: Path) -> int:
    try:
        db = sqlite3.connect(f"file:{index}?mode=ro", uri=True, timeout=1)
        try:
            return db.execute("SELECT COUNT(*) FROM dumps").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        return 0


def bench_crash_to_indexed(crasher: Path, sizes: list[int], runs: int, sdcd) -> tuple[str, dict]:
    """csplice's hold and crash-to-indexed with the default config, and systemd-coredump's hold of the same
    crash, alternating in the same run."""
    etc, state = WORK / "etc", WORK / "state"
    shutil.rmtree(state, ignore_errors=True)
    etc.mkdir(parents=True, exist_ok=True)
    # The default config (strategy auto), limits and the free-space floors off: a benchmark is a crash storm.
    (etc / "corehandler.toml").write_text(
        "[capture]\nmin_free = \"0\"\nmax_per_exe_per_minute = 0\n[metrics]\nenabled = false\n"
        "[journal]\nenabled = false\n[retention]\nkeep_free = \"0\"\nmax_use = \"0\"\n")
    ours = f"|{paths.csplice_path()} {SPECIFIERS}"
    set_pattern(ours)
    daemon = subprocess.Popen([sys.executable, "-P", "-m", "corehandler", "--config-dir", str(etc),
                               "--state-dir", str(state), "serve"], stderr=subprocess.PIPE, text=True)
    rows, samples = [], {}
    try:
        while "Watching" not in daemon.stderr.readline():
            pass
        index = state / "index.sqlite"
        for mib in sizes:
            holds, indexed, theirs = [], [], []
            for _ in range(runs):
                before = index_count(index)
                set_pattern(ours)
                t0, hold = timed_crash([str(crasher), "segv", str(mib)])
                while index_count(index) <= before:
                    time.sleep(0.002)
                indexed.append(time.monotonic() - t0)
                holds.append(hold)
                for f in (state / "store").rglob("*.zst"):
                    f.unlink()  # keep the disk free; the index row stays
                if sdcd:
                    set_pattern(sdcd.pattern)
                    theirs.append(timed_crash([str(crasher), "segv", str(mib)])[1])
                    sdcd.wait_stored()
            samples[mib] = {"csplice hold": holds, "csplice crash to indexed": indexed}
            row = [f"{mib} MiB dense", ms(holds), ms(indexed), paired_ratio(indexed, holds)]
            if sdcd:
                samples[mib]["systemd-coredump hold (Compress=yes)"] = theirs
                row += [ms(theirs), paired_ratio(indexed, theirs), paired_ratio(theirs, holds)]
            rows.append(row)
            print(f"indexed {mib} MiB: {row}", file=sys.stderr)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    header = ["crash", "csplice hold s", "crash to indexed s", "indexed ÷ hold"]
    if sdcd:
        header += ["systemd-coredump hold s", "indexed ÷ systemd-coredump hold (goal < 1)",
                   "systemd-coredump hold ÷ csplice hold (goal ≥ 8)"]
    return markdown_table(header, rows), samples


def _by_series(samples: dict) -> dict:
    """{mib: {series: [s]}} -> {series: {mib: [s]}}, as plot_holds draws it."""
    out: dict = {}
    for mib, series in samples.items():
        for name, values in series.items():
            out.setdefault(name, {})[mib] = values
    return out


def ms(values: list[float]) -> str:
    return f"{median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dense-mib", type=int, default=256)
    p.add_argument("--indexed-mib", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--no-systemd-coredump", dest="systemd_coredump", action="store_false")
    p.add_argument("--no-compression", dest="compression", action="store_false", help="skip part 1")
    p.add_argument("--no-indexed", dest="indexed", action="store_false", help="skip part 2")
    p.add_argument("--out", type=Path, default=HERE / "results" / "compress.md")
    a = p.parse_args()
    if os.geteuid() != 0:
        print("bench/compress.py needs root (it crashes real processes through core_pattern)", file=sys.stderr)
        return 2
    WORK.mkdir(parents=True, exist_ok=True)
    crasher = build_crasher(WORK / "bin")
    parts = [f"# Compression and ingest (bench/compress.py)\n\n{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} "
             f"UTC, {machine()}; store on {filesystem_of(WORK)}; medians of {a.runs} runs.\n"]
    try:
        with host_core_settings(paths.CSPLICE_SETTINGS):
            cores = capture_cores(crasher, a.dense_mib) if a.compression else {}
            if cores:
                parts.append("## zstd on real kernel cores, stored as the daemon does (compress, fsync, rename)\n\n"
                             + bench_compression(cores, a.runs))
            for core in cores.values():
                core.unlink()
            if a.indexed:
                with systemd_coredump(WORK) if a.systemd_coredump else contextlib.nullcontext() as sdcd:
                    text, samples = bench_crash_to_indexed(crasher, a.indexed_mib, a.runs, sdcd)
                parts.append("## Crash to indexed against systemd-coredump's hold, `corehandler serve` running "
                             "(default config: strategy auto, zstd level 3, threads = CPUs)\n\n"
                             f"{describe_cache(page_cache_state())} at the end.\n\n" + text
                             + "\n![crash to indexed](compress.png)\n")
                plot_holds(a.out.with_suffix(".png"), "csplice crash to indexed against systemd-coredump's hold "
                           "(bench/compress.py)", {"dense": _by_series(samples)}, {})
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(parts))
    print(a.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
