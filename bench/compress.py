"""What does storing a dump cost after csplice has released the crashed process, and how long until it is
listed?

1. Real kernel cores (root; takes the core_pattern lock and restores everything): the crasher dies through
   core_pattern into csplice and its cores are kept: dense (every page written), sparse (half the region never
   touched) and a typical program (a Python interpreter dying of SIGSEGV). Each is stored as the daemon does
   (compress.store_file: zstd, temp file, fsync, rename) at levels 1/3/6 with 1 and 2 threads; medians of
   --runs runs, speed also as a ratio against level 1 with one thread paired run by run.
2. Crash to indexed: `corehandler serve` running, a crasher dies; the clock starts at the crash trigger and
   stops when `corehandler list` would show the dump (its index row exists). The hold (the kernel holding the
   crashed process: trigger to reaping) is measured in the same run.
3. systemd-coredump with Compress=yes (--systemd-coredump): its socket served by systemd-socket-activate, a
   standalone systemd-journald and its store in a private mount namespace (the host's journal and
   /var/lib/systemd/coredump are untouched), core_pattern from its sysctl.d file. Hold of the same crash as a
   ratio against csplice's hold, measured alternately in the same run.

    python -P bench/compress.py [--runs 3] [--dense-mib 256] [--hold-mib 1024] [--systemd-coredump]
"""

from __future__ import annotations

import argparse
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

from common import filesystem_of, machine, markdown_table, median, paired_ratio  # noqa: E402

from corehandler import compress, paths  # noqa: E402
from corehandler.install import SPECIFIERS  # noqa: E402
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


def bench_crash_to_indexed(crasher: Path, sizes: list[int], runs: int) -> str:
    etc, state = WORK / "etc", WORK / "state"
    shutil.rmtree(state, ignore_errors=True)
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "corehandler.toml").write_text(
        "[capture]\nmin_free = \"0\"\nmax_per_exe_per_minute = 0\nstrategy = \"rw\"\n[metrics]\nenabled = false\n"
        "[journal]\nenabled = false\n[retention]\nkeep_free = \"0\"\nmax_use = \"0\"\n")
    set_pattern(f"|{paths.csplice_path()} {SPECIFIERS}")
    daemon = subprocess.Popen([sys.executable, "-P", "-m", "corehandler", "--config-dir", str(etc),
                               "--state-dir", str(state), "serve"], stderr=subprocess.PIPE, text=True)
    rows = []
    try:
        while "Watching" not in daemon.stderr.readline():
            pass
        index = state / "index.sqlite"
        for mib in sizes:
            holds, indexed = [], []
            for _ in range(runs):
                before = index_count(index)
                t0, hold = timed_crash([str(crasher), "segv", str(mib)])
                while index_count(index) <= before:
                    time.sleep(0.002)
                indexed.append(time.monotonic() - t0)
                holds.append(hold)
            rows.append([f"{mib} MiB dense", median(holds), median(indexed), paired_ratio(indexed, holds)])
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    return markdown_table(["crash", "hold s (median)", "crash to indexed s (median)", "indexed / hold"], rows)


# -- 3. systemd-coredump ------------------------------------------------------------------------------------

SDCD_SCRIPT = r"""
set -e
mount -t tmpfs -o mode=0755 tmpfs /run/systemd/journal
mkdir -p "$WORK/sdcd-store" "$WORK/sdcd-journal"
mount --bind "$WORK/sdcd-store" /var/lib/systemd/coredump
mount --bind "$WORK/sdcd-journal" /var/log/journal
/lib/systemd/systemd-journald &
for i in $(seq 100); do [ -S /run/systemd/journal/socket ] && break; sleep 0.05; done
rm -f /run/systemd/coredump
exec systemd-socket-activate --seqpacket -a -l /run/systemd/coredump /lib/systemd/systemd-coredump
"""


def sysctl_d_pattern() -> str:
    for line in Path("/usr/lib/sysctl.d/50-coredump.conf").read_text().splitlines():
        if line.startswith("kernel.core_pattern="):
            return line.split("=", 1)[1]
    raise RuntimeError("no core_pattern in 50-coredump.conf")


def bench_systemd_coredump(crasher: Path, mib: int, runs: int) -> str:
    spool = WORK / "hold" / "spool"
    shutil.rmtree(WORK / "hold", ignore_errors=True)
    shutil.rmtree(WORK / "sdcd-store", ignore_errors=True)
    # Mount points for the private namespace; any we had to create are removed afterwards.
    mount_points = [Path(d) for d in ("/var/lib/systemd/coredump", "/var/log/journal", "/run/systemd/journal")]
    created = [d for d in mount_points if not d.exists()]
    for d in created:
        d.mkdir(parents=True)
    # Its own session and a private mount namespace: the tmpfs and bind mounts vanish with it.
    server = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", SDCD_SCRIPT],
                              env=dict(os.environ, WORK=str(WORK)), start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(200):
            if Path("/run/systemd/coredump").is_socket():
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("systemd-socket-activate did not listen on /run/systemd/coredump")
        sd_pattern = sysctl_d_pattern()
        paths.CSPLICE_SETTINGS.write_text(csplice_conf(spool))
        ours, theirs = [], []
        argv = [str(crasher), "segv", str(mib)]
        for i in range(runs):
            set_pattern(f"|{paths.csplice_path()} {SPECIFIERS}")
            ours.append(timed_crash(argv)[1])
            wait_records(spool, i + 1)
            for f in spool.glob("*.core"):
                f.unlink()  # keep the disk free; the record stays for counting
            set_pattern(sd_pattern)
            before = len(list((WORK / "sdcd-store").glob("core.*")))
            theirs.append(timed_crash(argv)[1])
            deadline = time.monotonic() + 120
            while len(list((WORK / "sdcd-store").glob("core.*"))) <= before and time.monotonic() < deadline:
                time.sleep(0.05)
            stored = sorted((WORK / "sdcd-store").glob("core.*"))
            if len(stored) <= before:
                raise RuntimeError("systemd-coredump stored nothing: " + server.stderr.read1(4096).decode())
        names = [p.name for p in stored]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
        Path("/run/systemd/coredump").unlink(missing_ok=True)
        for d in created:
            d.rmdir()
    compressed = all(n.endswith((".zst", ".xz", ".lz4")) for n in names)
    rows = [[f"{mib} MiB dense", "csplice (rw)", median(ours), 1.0],
            [f"{mib} MiB dense", "systemd-coredump, Compress=yes" + ("" if compressed else " (NOT compressed!)"),
             median(theirs), paired_ratio(theirs, ours)]]
    shutil.rmtree(WORK / "sdcd-store", ignore_errors=True)
    return markdown_table(["crash", "handler", "hold s (median)", "hold / csplice's"], rows) + \
        f"\nsystemd-coredump stored {names[-1]}\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dense-mib", type=int, default=256)
    p.add_argument("--indexed-mib", type=int, nargs="+", default=[16, 256])
    p.add_argument("--hold-mib", type=int, default=1024)
    p.add_argument("--systemd-coredump", action="store_true")
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
                parts.append("## Crash to indexed, `corehandler serve` running (level 3, threads = CPUs)\n\n"
                             + bench_crash_to_indexed(crasher, a.indexed_mib, a.runs))
            if a.systemd_coredump:
                parts.append("## Hold time against systemd-coredump (Compress=yes), same crash, same run\n\n"
                             + bench_systemd_coredump(crasher, a.hold_mib, a.runs))
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text("\n".join(parts))
    print(a.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
