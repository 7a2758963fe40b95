"""What does storing a dump cost after csplice has released the crashed process, how long until it is
listed, and how long until it is stored?

1. Real kernel cores (root; takes the core_pattern lock and restores everything): the crasher dies through
   core_pattern into csplice and its cores are kept: dense (every page written), sparse (half the region never
   touched) and a typical program (a Python interpreter dying of SIGSEGV). Each is stored as the daemon does
   (compress.store_file: zstd verified as it streams, sha256, temp file, fsync, rename) at levels 1/3/6 with 1
   and 2 threads, and, paired run by run, compressed by the zstd CLI alone at the same level and threads (no
   hash, no verification, no fsync): medians of --runs runs, the daemon's time over zstd's, and speed as a
   ratio against level 1 with one thread.
2. Crash to listed and to stored: `corehandler serve` running with the default config (strategy auto), a
   crasher dies; the clock starts at the crash trigger; "listed" is when `corehandler list` would show the dump
   (its index row, status `compressing`, with its analysis), "stored" when its row is final (its core
   compressed, verified, fsynced). The hold (trigger to reaping) is measured in the same run, and after each
   crash the zstd CLI compresses the same core (the stored file decompressed) at the daemon's level and
   threads, so "store ÷ zstd alone" compares the daemon's store stage (listed to stored: validation, zstd,
   verification, sha256, fsync, index) with zstd on the same bytes. systemd-coredump's hold of the same crash
   with its default Compress=yes alternates with it (bench/sdcd.py; --no-systemd-coredump skips it).

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
    csplice_settings,
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
from corehandler.config import CompressionConfig  # noqa: E402
from corehandler.csplice_contract import SPECIFIERS  # noqa: E402
from corehandler.store import compress  # noqa: E402
from support.crash import build_crasher  # noqa: E402
from support.host_core import borrowed  # noqa: E402
from support.waiting import wait_for  # noqa: E402

MiB = 1 << 20
LEVELS = (1, 3, 6)
THREADS = (1, 2)
# The daemon's default [compression] (config.py): part 2 runs with it.
DAEMON_LEVEL, DAEMON_THREADS = CompressionConfig().level, CompressionConfig().threads
WORK = Path("/tmp/daemon-bench")


def _allow_core():
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def csplice_conf(spool: Path) -> str:
    spool.mkdir(mode=0o700, parents=True, exist_ok=True)
    return csplice_settings(spool, max_pending=0, max_per_exe_per_minute=0, min_free=0, strategy="rw")


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

def capture_cores(lent, crasher: Path, dense_mib: int) -> dict[str, Path]:
    """Real cores of the crasher, kept; lent: the borrowed handler (support/host_core.py)."""
    spool, cores = WORK / "capture" / "spool", WORK / "cores"
    shutil.rmtree(WORK / "capture", ignore_errors=True)
    cores.mkdir(parents=True, exist_ok=True)
    lent.write_settings(csplice_conf(spool))
    lent.point(f"|{paths.csplice_path()} {SPECIFIERS}", 16)
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


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def zstd_alone(core: Path, level: int, threads: int, cpu: list[float] | None = None) -> float:
    """Seconds the zstd CLI takes to compress core at that level and number of worker threads, into a file (it
    writes its content checksum as the daemon has zstd do; it neither hashes, verifies nor fsyncs). Its CPU
    seconds are appended to cpu."""
    out = core.with_suffix(".cli.zst")
    c0, t0 = cpu_seconds(resource.RUSAGE_CHILDREN), time.monotonic()
    subprocess.run(["zstd", "-q", "-f", f"-{level}", f"-T{threads}", str(core), "-o", str(out)], check=True)
    seconds = time.monotonic() - t0
    if cpu is not None:
        cpu.append(cpu_seconds(resource.RUSAGE_CHILDREN) - c0)
    out.unlink()
    return seconds


def bench_compression(cores: dict[str, Path], runs: int) -> str:
    store = WORK / "store"
    store.mkdir(parents=True, exist_ok=True)
    rows = []
    for kind, core in cores.items():
        raw = core.stat().st_size
        alloc = core.stat().st_blocks * 512
        seconds: dict[tuple, list[float]] = {}
        alone: dict[tuple, list[float]] = {}
        cpu: dict[tuple, list[float]] = {}
        cpu_alone: dict[tuple, list[float]] = {}
        stored: dict[tuple, int] = {}
        compress.store_file(core, store, "bench").path.unlink()  # warm-up: page cache, allocator
        for _ in range(runs):
            for level in LEVELS:
                for threads in THREADS:
                    key = (level, threads)
                    c0 = cpu_seconds(resource.RUSAGE_SELF)  # zstd's workers are threads of this process
                    s = compress.store_file(core, store, "bench", level=level, threads=threads)
                    cpu.setdefault(key, []).append(cpu_seconds(resource.RUSAGE_SELF) - c0)
                    seconds.setdefault(key, []).append(s.seconds)
                    stored[key] = s.stored_bytes
                    s.path.unlink()
                    alone.setdefault(key, []).append(zstd_alone(core, level, threads, cpu_alone.setdefault(key, [])))
        base = seconds[(1, 1)]
        for key, secs in seconds.items():
            rows.append([kind, f"{raw / MiB:.0f} MiB ({alloc / MiB:.0f} allocated)", *key,
                         raw / median(secs) / MiB, raw / median(alone[key]) / MiB, paired_ratio(secs, alone[key]),
                         f"{median(cpu[key]):.2f} / {median(cpu_alone[key]):.2f}", raw / stored[key],
                         paired_ratio(base, secs)])
    return markdown_table(["core", "size", "level", "threads", "stored as the daemon does, MiB/s (median)",
                           "zstd CLI alone, MiB/s", "daemon ÷ zstd alone, wall (goal ≤ 1.2)",
                           "CPU s: daemon / zstd alone", "ratio raw/stored", "speed vs level 1, 1 thread"], rows)


# -- 2. crash to listed and to stored ------------------------------------------------------------------------

def newest_row(index: Path) -> tuple[int, str | None, str | None, str | None]:
    """(rows, id, status, path) of the newest dump in the index; (0, None, None, None) before there is one."""
    try:
        db = sqlite3.connect(f"file:{index}?mode=ro", uri=True, timeout=1)
        try:
            count = db.execute("SELECT COUNT(*) FROM dumps").fetchone()[0]
            row = db.execute("SELECT id, status, path FROM dumps ORDER BY crashed_at DESC, id DESC LIMIT 1").fetchone()
            return (count, *row) if row else (0, None, None, None)
        finally:
            db.close()
    except sqlite3.Error:
        return 0, None, None, None


def bench_crash_to_stored(lent, crasher: Path, sizes: list[int], runs: int, sdcd) -> tuple[str, dict]:
    """csplice's hold, crash to listed and crash to stored with the default config, zstd alone on the same
    core, and systemd-coredump's hold of the same crash, alternating in the same run (lent: the borrowed
    handler, support/host_core.py)."""
    etc, state = WORK / "etc", WORK / "state"
    shutil.rmtree(state, ignore_errors=True)
    etc.mkdir(parents=True, exist_ok=True)
    # The default config (strategy auto), limits and the free-space floors off: a benchmark is a crash storm.
    (etc / "corehandler.toml").write_text(
        "[capture]\nmin_free = \"0\"\nmax_per_exe_per_minute = 0\n[metrics]\nenabled = false\n"
        "[journal]\nenabled = false\n[retention]\nkeep_free = \"0\"\nmax_use = \"0\"\n")
    level, threads = DAEMON_LEVEL, compress.resolve_threads(DAEMON_THREADS)
    cli = [sys.executable, "-P", "-m", "corehandler", "--config-dir", str(etc), "--state-dir", str(state)]
    # The bench's state dir claims the handler (csplice.conf from the config, naming it), so that its daemon
    # owns csplice.conf and renders it as a host's would; the borrow puts everything back.
    subprocess.run(cli + ["install", "--force", "--no-daemon"], check=True, capture_output=True, timeout=300)
    ours = f"|{paths.csplice_path()} {SPECIFIERS}"
    lent.point(ours, 16)
    daemon = subprocess.Popen(cli + ["serve"], stderr=subprocess.PIPE, text=True)
    rows, samples, loads = [], {}, []
    try:
        while "Watching" not in daemon.stderr.readline():
            pass
        index = state / "index.sqlite"
        for mib in sizes:
            holds, listed, stored, alone, theirs = [], [], [], [], []
            for _ in range(runs):
                before = newest_row(index)[0]
                lent.point(ours, 16)
                t0, hold = timed_crash([str(crasher), "segv", str(mib)])
                # A crash that never reaches our spool (another csplice.conf put in place meanwhile) fails the run.
                row = wait_for(lambda: (r := newest_row(index))[0] > before and r, 600, "the dump listed",
                               interval=0.002)
                listed.append(time.monotonic() - t0)
                row = wait_for(lambda: (r := newest_row(index))[2] != "compressing" and r, 600, "the dump stored",
                               interval=0.002)
                stored.append(time.monotonic() - t0)
                holds.append(hold)
                loads.append(os.getloadavg()[0])
                # zstd alone on the same bytes, then the disk freed (the index row stays)
                same = WORK / "same.core"
                with open(same, "wb") as out:
                    compress.decompress_to(state / "store" / row[3], out)
                alone.append(zstd_alone(same, level, threads))
                same.unlink()
                for f in (state / "store").rglob("*.zst"):
                    f.unlink()
                if sdcd:
                    lent.point(sdcd.pattern, 16)
                    theirs.append(timed_crash([str(crasher), "segv", str(mib)])[1])
                    sdcd.wait_stored()
            store_stage = [s - v for s, v in zip(stored, listed)]
            samples[mib] = {"csplice hold": holds, "csplice crash to listed": listed,
                            "csplice crash to stored": stored}
            row = [f"{mib} MiB dense", sec(holds), sec(listed), ms([v - h for v, h in zip(listed, holds)]),
                   sec(stored), sec(store_stage), sec(alone), paired_ratio(store_stage, alone),
                   paired_ratio([s - h for s, h in zip(stored, holds)], alone)]
            if sdcd:
                samples[mib]["systemd-coredump hold (Compress=yes)"] = theirs
                row += [sec(theirs), paired_ratio(stored, theirs), paired_ratio(theirs, holds)]
            rows.append(row)
            print(f"{mib} MiB: {row}", file=sys.stderr)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    header = ["crash", "csplice hold s", "crash to listed s", "listed − hold ms (goal ≤ 300)", "crash to stored s",
              "store stage (listed to stored) s", f"zstd -{level} -T{threads} alone, same core s",
              "store stage ÷ zstd alone (goal ≤ 1.2)", "(stored − hold) ÷ zstd alone"]
    if sdcd:
        header += ["systemd-coredump hold s", "stored ÷ systemd-coredump hold",
                   "systemd-coredump hold ÷ csplice hold (goal ≥ 8)"]
    load = f"load average {min(loads):.1f}–{max(loads):.1f} during the crashes" if loads else ""
    return markdown_table(header, rows) + f"\n{load}\n", samples


def _by_series(samples: dict) -> dict:
    """{mib: {series: [s]}} -> {series: {mib: [s]}}, as plot_holds draws it."""
    out: dict = {}
    for mib, series in samples.items():
        for name, values in series.items():
            out.setdefault(name, {})[mib] = values
    return out


def sec(values: list[float]) -> str:
    return f"{median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def ms(values: list[float]) -> str:
    return f"{median(values) * 1e3:.0f} ({min(values) * 1e3:.0f}–{max(values) * 1e3:.0f})"


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
    # SIGTERM unwinds like an error, so the borrow puts core_pattern, csplice.conf and sysctl.d back.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    WORK.mkdir(parents=True, exist_ok=True)
    crasher = build_crasher(WORK / "bin")
    parts = [f"# Compression and ingest (bench/compress.py)\n\n{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} "
             f"UTC, {machine()}; store on {filesystem_of(WORK)}; medians of {a.runs} runs.\n"]
    try:
        with borrowed("bench/compress.py") as lent:
            cores = capture_cores(lent, crasher, a.dense_mib) if a.compression else {}
            if cores:
                parts.append("## zstd on real kernel cores, stored as the daemon does (compress, fsync, rename)\n\n"
                             + bench_compression(cores, a.runs))
            for core in cores.values():
                core.unlink()
            if a.indexed:
                with systemd_coredump(WORK) if a.systemd_coredump else contextlib.nullcontext() as sdcd:
                    text, samples = bench_crash_to_stored(lent, crasher, a.indexed_mib, a.runs, sdcd)
                workers = compress.resolve_threads(DAEMON_THREADS)
                plot = a.out.with_suffix(".png")
                parts.append("## Crash to listed and to stored, `corehandler serve` running (default config: "
                             f"strategy auto, zstd level {DAEMON_LEVEL}, {workers} worker threads)\n\n"
                             f"{describe_cache(page_cache_state())} at the end.\n\n" + text
                             + f"\n![crash to listed and stored]({plot.name})\n")
                plot_holds(plot, "csplice crash to listed and to stored against the hold "
                           "(bench/compress.py)", {"dense": _by_series(samples)}, {})
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(parts))
    print(a.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
