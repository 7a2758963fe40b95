"""How soon is a crash stored, against zstd alone on the same core, and does a big compression slow a capture?

`corehandler serve` runs with the default config (`[compression] threads = "auto"`: as many zstd workers as
there are CPUs, at the daemon's lower priority: idlecpus.py) on a state dir of its own, with --debug so that its log
says how many workers each dump got.

1. Crash to stored: a dense crasher dies through core_pattern into csplice; the hold runs from the crash trigger
   to the reaping, "stored" from the reaping (the release) to the dump's row final (compressed, verified,
   fsynced). In the same round the zstd CLI compresses the same bytes (the stored file decompressed to a file,
   so in the page cache) with `zstd -1 -T1`: stored ÷ zstd alone per round, median and spread over the runs
   (issue 37's goal on an idle 2-CPU machine: ≤ 0.6).
2. A capture during a big compression: per run, in alternating order, a SMALL crash on an idle daemon, and the
   same SMALL crash once a BIG crash's compression is under way (its row `compressing`, its `.tmp.ID.zst` in
   the store growing); the small crash's hold busy ÷ idle per run (goal ≤ 1.15). A round counts only when the
   big compression was still running when the small crash was reaped: the table says in how many it was.

3. A capture during an upload: a daemon of its own uploads every stored dump to a real S3 server (SeaweedFS's
   weed mini on loopback, as the tests run it); per run, in alternating order, the SMALL crash on an idle
   daemon and the same crash while the BIG crash's stored file goes up (its queue row uploading, its multipart
   upload open on the server); busy ÷ idle per run (goal ≤ 1.15). Twice: with the server on the same CPUs,
   then held to SERVER_CPU_PERCENT of one CPU by a cgroup, standing in for a bucket on another host.

The machine's state (load, page cache) is read at every crash and stated beside the tables.

Live (root; borrows core_pattern and csplice.conf, puts them back on every exit):
    python -P bench/stored.py [--runs 5] [--sizes 256,1024,4096] [--small 256] [--big 4096]
Smoke (no root, nothing of the host touched): the feeder pipes a synthetic core into csplice instead of the
kernel, and the "hold" is the feeder's time:
    python -P bench/stored.py --feeder --runs 1 --sizes 64 --small 16 --big 64 --out /tmp/stored-smoke.md
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
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
    publish,
)

from corehandler import idlecpus, paths  # noqa: E402
from corehandler.csplice_contract import SPECIFIERS  # noqa: E402
from corehandler.store import compress  # noqa: E402
from support import cbuild  # noqa: E402
from support.crash import build_crasher  # noqa: E402
from support.spoolfeed import feed, write_settings  # noqa: E402
from support.waiting import wait_for  # noqa: E402

MiB = 1 << 20
STORED_GOAL, PAIRED_GOAL = 0.6, 1.15
# Part 3's second row: the S3 server's share of a CPU, standing in for a bucket on another host.
SERVER_CPU_PERCENT = 10
STORED_LINE = re.compile(r"Stored (\S+): \d+ -> \d+ bytes in [\d.]+ s, (\d+) zstd workers")


def _allow_core():
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


class Daemon:
    """`corehandler serve --debug` on the bench's state dir; its log read by a thread (a pipe nobody reads
    would stop the daemon at its next line), the zstd workers of each stored dump kept."""

    def __init__(self, work: Path, live: bool, extra_config: str = "", io_realtime: bool = False):
        self.etc, self.state = work / "etc", work / "state"
        shutil.rmtree(self.state, ignore_errors=True)
        self.etc.mkdir(parents=True, exist_ok=True)
        # The default config; limits and free-space floors off: a benchmark is a crash storm.
        (self.etc / "corehandler.toml").write_text(
            "[capture]\nmin_free = \"0\"\nmax_per_exe_per_minute = 0\nmax_pending = 0\n"
            f"io_realtime = {str(io_realtime).lower()}\n[metrics]\nenabled = false\n"
            "[journal]\nenabled = false\n[retention]\nkeep_free = \"0\"\nmax_use = \"0\"\n" + extra_config)
        self.cli = [sys.executable, "-P", "-m", "corehandler", "--config-dir", str(self.etc),
                    "--state-dir", str(self.state)]
        if live:  # the bench's state dir claims the handler, so its daemon renders csplice.conf as a host's would
            subprocess.run(self.cli + ["install", "--force", "--no-daemon"], check=True, capture_output=True,
                           timeout=300)
        self.state.joinpath("spool").mkdir(parents=True, exist_ok=True)
        self.workers: dict[str, int] = {}
        self.proc = subprocess.Popen(self.cli + ["serve", "--debug", "--log-format", "text"],
                                     stderr=subprocess.PIPE, text=True)
        self._up = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._up.wait(300):
            raise SystemExit("corehandler serve did not start watching its spool in 300 s")

    def _read(self) -> None:
        for line in self.proc.stderr:
            if "Watching" in line:
                self._up.set()
            if m := STORED_LINE.search(line):
                self.workers[m.group(1)] = int(m.group(2))

    @property
    def index(self) -> Path:
        return self.state / "index.sqlite"

    @property
    def store(self) -> Path:
        return self.state / "store"

    def _query(self, sql: str, args: tuple = ()) -> list[tuple] | None:
        """The rows of a query of the daemon's index, read-only; None while it cannot be read (not made yet,
        or its uploads table not yet)."""
        try:
            db = sqlite3.connect(f"file:{self.index}?mode=ro", uri=True, timeout=1)
            try:
                return db.execute(sql, args).fetchall()
            finally:
                db.close()
        except sqlite3.Error:
            return None

    def row(self, dump_id: str) -> tuple[str, str | None] | None:
        """(status, stored file) of a dump, None before it is listed."""
        rows = self._query("SELECT status, path FROM dumps WHERE id = ?", (dump_id,))
        return rows[0] if rows else None

    def moved_to_direct(self, dump_id: str) -> bool:
        """csplice's rw handed the dump's capture to O_DIRECT part way (its record's capture.direct_from)."""
        rows = self._query("SELECT record FROM dumps WHERE id = ?", (dump_id,))
        return bool(rows) and json.loads(rows[0][0]).get("capture", {}).get("direct_from") is not None

    def newest(self, after: set[str]) -> str | None:
        new = sorted(self.ids() - after)
        return new[-1] if new else None

    def ids(self) -> set[str]:
        return {r[0] for r in self._query("SELECT id FROM dumps") or ()}

    def wait_stored(self, dump_id: str) -> str:
        """Waits until the dump's row is final; its stored file's name."""
        row = wait_for(lambda: (r := self.row(dump_id)) and r[0] != "compressing" and r, 1800,
                       f"{dump_id} stored", interval=0.002)
        return row[1]

    def upload_state(self, dump_id: str) -> str | None:
        """The dump's row in the upload queue (pending, uploading, done, failed), None before it is queued."""
        rows = self._query("SELECT state FROM uploads WHERE id = ?", (dump_id,))
        return rows[0][0] if rows else None

    def compressing(self, dump_id: str) -> bool:
        """The dump's compression is under way now: its temp file in the store exists and holds bytes."""
        tmp = self.store / f".tmp.{dump_id}{compress.COMPRESSED_SUFFIX}"
        try:
            return tmp.stat().st_size > 0
        except FileNotFoundError:
            return False

    def clear_store(self) -> None:
        """The stored files removed (the rows stay): the disk is not the bench's to fill."""
        for f in self.store.glob("*.zst"):
            f.unlink(missing_ok=True)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Crashes:
    """Crashes of a given size into the daemon's spool: the live kernel's (crasher, core_pattern) or the
    feeder's. crash() returns (monotonic time of the release, hold seconds)."""

    def __init__(self, work: Path, daemon: Daemon, lent):
        self.daemon, self.lent = daemon, lent
        if lent is not None:
            self.crasher = build_crasher(work / "bin")
            self.pattern = f"|{paths.csplice_path()} {SPECIFIERS}"
        else:
            self.feeder, self.csplice = cbuild.feeder(), paths.csplice_path()
            self.settings = write_settings(work / "csplice.conf", daemon.state / "spool")
            self.pid = 30000

    def crash(self, mib: int) -> tuple[float, float]:
        if self.lent is None:
            self.pid += 1
            started = time.monotonic()
            feed(self.feeder, self.csplice, self.settings, size=mib * MiB, pid=self.pid, comm="stored-bench")
            released = time.monotonic()
            return released, released - started
        self.lent.point(self.pattern, 16)  # another user of the host may have pointed it elsewhere meanwhile
        proc = subprocess.Popen([str(self.crasher), "segv", str(mib), "--wait"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, preexec_fn=_allow_core)
        proc.stdout.readline()  # memory filled: the crash is one newline away
        started = time.monotonic()
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        _, status, _ = os.wait4(proc.pid, 0)
        released = time.monotonic()
        proc.returncode = -1  # reaped above
        proc.stdin.close()
        proc.stdout.close()
        if not os.WIFSIGNALED(status):
            raise SystemExit(f"the crasher did not crash: status {status:#x}")
        return released, released - started

    def listed(self, before: set[str]) -> str:
        return wait_for(lambda: self.daemon.newest(before), 600, "the crash listed", interval=0.002)


def zstd_alone(daemon: Daemon, stored: str, work: Path) -> float:
    """Seconds `zstd -1 -T1` takes on the same bytes (decompressed to a file first: in the page cache)."""
    same, out = work / "same.core", work / "same.core.zst"
    with open(same, "wb") as f:
        compress.decompress_to(daemon.store / stored, f)
    started = time.monotonic()
    subprocess.run(["zstd", "-q", "-f", "-1", "-T1", str(same), "-o", str(out)], check=True)
    seconds = time.monotonic() - started
    same.unlink()
    out.unlink()
    return seconds


def state_now() -> dict:
    return page_cache_state()


def crash_to_stored(daemon: Daemon, crashes: Crashes, sizes: list[int], runs: int, work: Path) -> tuple[str, list]:
    rows, misses = [], []
    for mib in sizes:
        holds, stored, alone, workers, states = [], [], [], [], []
        for run in range(runs):
            before = daemon.ids()
            states.append(state_now())
            released, hold = crashes.crash(mib)
            dump_id = crashes.listed(before)
            name = daemon.wait_stored(dump_id)
            stored.append(time.monotonic() - released)
            holds.append(hold)
            time.sleep(0.2)  # the log line may trail the row
            workers.append(daemon.workers.get(dump_id, 0))
            alone.append(zstd_alone(daemon, name, work))
            daemon.clear_store()
            print(f"{mib} MiB run {run + 1}/{runs}: hold {hold:.2f} s, stored {stored[-1]:.2f} s after release, "
                  f"zstd -1 -T1 {alone[-1]:.2f} s, {workers[-1]} workers", file=sys.stderr)
        ratios = [s / a for s, a in zip(stored, alone)]
        loads = [s["load"] for s in states]
        rows.append([f"{mib} MiB dense", sec(holds), sec(stored), sec(alone), median(ratios),
                     f"{min(ratios):.2f}–{max(ratios):.2f}", "yes" if median(ratios) <= STORED_GOAL else "no",
                     spread_int(workers),
                     f"{min(loads):.2f}–{max(loads):.2f}"])
        if median(ratios) > STORED_GOAL:
            misses.append(f"{mib} MiB: stored {median(ratios):.2f}× zstd -1 -T1 (goal ≤ {STORED_GOAL})")
    header = ["crash", "hold s", "release → stored s", "zstd -1 -T1 alone, same core s",
              "stored ÷ zstd alone (median)", "min–max", f"≤ {STORED_GOAL}", "zstd workers (auto)",
              "load at the crash"]
    return markdown_table(header, rows), misses


def capture_during(daemon: Daemon, crashes: Crashes, small: int, runs: int, what: str, start, running, settle
                   ) -> tuple[str, list]:
    """Per run, in alternating order, the SMALL crash on an idle daemon and the same crash while the daemon is
    busy with `what`: start(ids before) sets that under way and returns the big dump's id, running(id) says
    whether it still runs, settle(ids) waits until the daemon is done with those dumps (idle again)."""
    idle, busy, overlapped, states, moved = [], [], 0, [], {"idle": 0, "busy": 0}
    for run in range(runs):
        order = ("idle", "busy") if run % 2 == 0 else ("busy", "idle")
        for kind in order:
            before = daemon.ids()
            if kind == "idle":
                states.append(state_now())
                _, hold = crashes.crash(small)
                small_id = crashes.listed(before)
                settle([small_id])
                idle.append(hold)
            else:
                big_id = start(before)
                states.append(state_now())
                _, hold = crashes.crash(small)
                still = running(big_id)
                overlapped += still
                busy.append(hold)
                small_id = crashes.listed(before | {big_id})
                settle([big_id, small_id])
                print(f"run {run + 1}/{runs}: small crash held {hold:.3f} s during {what} "
                      f"({'still running' if still else 'ENDED before the reaping'})", file=sys.stderr)
            moved[kind] += daemon.moved_to_direct(small_id)
            daemon.clear_store()
    ratios = [b / i for b, i in zip(busy, idle)]
    loads = [s["load"] for s in states]
    row = [f"{small} MiB dense during {what}", ms(idle), ms(busy), median(ratios),
           f"{min(ratios):.2f}–{max(ratios):.2f}", "yes" if median(ratios) <= PAIRED_GOAL else "no",
           f"{overlapped} of {runs}", f"{moved['idle']} / {moved['busy']} of {runs}",
           f"{min(loads):.2f}–{max(loads):.2f}"]
    misses = [] if median(ratios) <= PAIRED_GOAL else [
        f"a capture during {what} held {median(ratios):.2f}× an idle daemon's (goal ≤ {PAIRED_GOAL})"]
    if overlapped < runs:
        misses.append(f"{what} had ended before the small crash's reaping in {runs - overlapped} of {runs} runs: "
                      "give --big a larger size")
    header = ["crash", "hold, idle daemon ms", "hold, busy daemon ms", "busy ÷ idle (median of pairs)",
              "min–max", f"≤ {PAIRED_GOAL}", "runs the busy work outlasted the hold",
              "captures moved to O_DIRECT, idle / busy", "load at the crash"]
    return markdown_table(header, [row]), misses


def capture_during_compression(daemon: Daemon, crashes: Crashes, small: int, big: int, runs: int
                               ) -> tuple[str, list]:
    def start(before: set[str]) -> str:
        crashes.crash(big)
        big_id = crashes.listed(before)
        wait_for(lambda: daemon.compressing(big_id) or daemon.row(big_id)[0] != "compressing", 600,
                 "the big dump's compression under way", interval=0.002)
        return big_id

    return capture_during(daemon, crashes, small, runs, f"a {big} MiB compression", start, daemon.compressing,
                          lambda ids: [daemon.wait_stored(i) for i in ids])


def capture_during_upload(daemon: Daemon, crashes: Crashes, server, bucket: str, small: int, big: int, runs: int,
                          where: str) -> tuple[str, list]:
    """The daemon uploads every stored dump to the real S3 server: the SMALL crash on an idle daemon, and
    while the BIG crash's stored file goes up (its row uploading and its multipart upload open on the
    server)."""
    def uploading(dump_id: str) -> bool:
        return daemon.upload_state(dump_id) == "uploading" and bool(server.multipart_uploads(bucket))

    stored = []

    def start(before: set[str]) -> str:
        crashes.crash(big)
        big_id = crashes.listed(before)
        stored.append((daemon.store / daemon.wait_stored(big_id)).stat().st_size)
        wait_for(lambda: uploading(big_id) or daemon.upload_state(big_id) in ("done", "failed"), 600,
                 "the big dump's upload under way", interval=0.005)
        return big_id

    def settle(ids: list[str]) -> None:
        for i in ids:
            daemon.wait_stored(i)
            state = wait_for(lambda: (s := daemon.upload_state(i)) in ("done", "failed") and s, 1800,
                             f"{i} uploaded", interval=0.01)
            if state != "done":
                raise SystemExit(f"the upload of {i} failed: see the daemon's log")
        client = server.client()
        for key in server.keys(bucket):  # the bucket is not the bench's disk to fill either
            client.delete_object(Bucket=bucket, Key=key)

    table, misses = capture_during(daemon, crashes, small, runs,
                                   f"the upload of a {big} MiB crash's dump to {where}", start, uploading, settle)
    return table + f"\n\nThe big dump's stored file: {median(stored) / MiB:.0f} MiB (what went up).\n", misses


@contextlib.contextmanager
def cpu_capped(pid: int, percent: int):
    """The process pid (all its threads, and those it starts later) held to `percent` of one CPU by a cgroup of
    its own (v2's cpu.max, or v1's CFS quota); moved back and the cgroup removed on exit."""
    unified = Path("/sys/fs/cgroup")
    root = unified if (unified / "cgroup.controllers").exists() else unified / "cpu"
    group = root / f"corehandler-bench-{os.getpid()}"
    group.mkdir()
    try:
        if root == unified:
            (group / "cpu.max").write_text(f"{percent * 1000} 100000\n")
        else:
            (group / "cpu.cfs_period_us").write_text("100000\n")
            (group / "cpu.cfs_quota_us").write_text(f"{percent * 1000}\n")
        (group / "cgroup.procs").write_text(f"{pid}\n")
        try:
            yield
        finally:
            (root / "cgroup.procs").write_text(f"{pid}\n")
    finally:
        group.rmdir()


def during_upload(a, lent) -> tuple[list[str], list]:
    """Part 3 on a daemon of its own that uploads every dump to a real S3 server (weed mini on loopback): once
    with the server as a neighbour on this host's CPUs, once with it held to SERVER_CPU_PERCENT of one CPU,
    which stands in for a bucket on another host (the uploader's own work stays on this host in full)."""
    from support.s3server import S3Server

    server = S3Server(a.work / "s3").start()
    tables, misses = [], []
    try:
        bucket = server.new_bucket()
        creds = server.credentials_file(a.work / "credentials")
        daemon = Daemon(a.work / "upload", live=not a.feeder, extra_config=(
            f'[upload]\nurl = "s3://{bucket}/bench"\nendpoint = "{server.endpoint}"\n'
            f'credentials_file = "{creds}"\nhost = "bench"\n'), io_realtime=a.io_realtime)
        try:
            crashes = Crashes(a.work / "upload", daemon, lent)
            for capped in (False, True):
                with cpu_capped(server.proc.pid, SERVER_CPU_PERCENT) if capped else contextlib.nullcontext():
                    where = (f"a server held to {SERVER_CPU_PERCENT}% of a CPU (a remote bucket's stand-in)"
                             if capped else "a server on the same CPUs and disk")
                    table, missed = capture_during_upload(daemon, crashes, server, bucket, a.small, a.big, a.runs,
                                                          where)
                tables.append(f"To {where}:\n\n{table}")
                misses += missed
            return tables, misses
        finally:
            daemon.stop()
    finally:
        server.stop()


def sec(values: list[float]) -> str:
    return f"{median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def ms(values: list[float]) -> str:
    return f"{median(values) * 1e3:.0f} ({min(values) * 1e3:.0f}–{max(values) * 1e3:.0f})"


def spread_int(values: list[int]) -> str:
    return str(values[0]) if min(values) == max(values) else f"{min(values)}–{max(values)}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--sizes", default="256,1024,4096", help="MiB, comma-separated: crash to stored")
    p.add_argument("--small", type=int, default=256, help="MiB: the crash that arrives during the compression")
    p.add_argument("--big", type=int, default=4096, help="MiB: the crash whose compression it arrives during")
    p.add_argument("--no-stored", dest="stored", action="store_false", help="skip part 1")
    p.add_argument("--no-during", dest="during", action="store_false", help="skip part 2")
    p.add_argument("--no-upload", dest="upload", action="store_false", help="skip part 3")
    p.add_argument("--io-realtime", action="store_true",
                   help="[capture] io_realtime = true: the captures' writes in the realtime I/O class")
    p.add_argument("--feeder", action="store_true", help="the feeder instead of the kernel (no root, a smoke test)")
    p.add_argument("--work", type=Path, default=Path("/var/tmp/corehandler-bench-stored"))
    p.add_argument("--out", type=Path, default=HERE / "results" / "stored.md")
    a = p.parse_args()
    if not a.feeder and os.geteuid() != 0:
        print("bench/stored.py needs root (it crashes real processes through core_pattern); --feeder does not",
              file=sys.stderr)
        return 2
    if shutil.which("zstd") is None:
        print("bench/stored.py needs the zstd CLI", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # unwinds: the borrow puts the host back
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    sizes = [int(x) for x in a.sizes.split(",") if x]
    before = page_cache_state()
    parts = ["# Crash to stored, and a capture during a big compression or an upload (bench/stored.py)\n",
             f"`python -P bench/stored.py {' '.join(sys.argv[1:])}`, "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
             + (", **feeder, not the kernel: a smoke test**" if a.feeder else ", live kernel (core_pipe_limit 16)")
             + ".\n",
             f"Machine: {machine()}; CPU affinity {idlecpus.workers()}; state dir on {filesystem_of(a.work)}.",
             f"Before: {describe_cache(before)}.\n"]
    misses: list[str] = []
    try:
        if a.feeder:
            lent_cm = contextlib.nullcontext()
        else:
            from support.host_core import borrowed
            lent_cm = borrowed("bench/stored.py")
        with lent_cm as lent:
            daemon = Daemon(a.work, live=not a.feeder, io_realtime=a.io_realtime)
            try:
                crashes = Crashes(a.work, daemon, lent)
                if a.stored:
                    table, missed = crash_to_stored(daemon, crashes, sizes, a.runs, a.work)
                    parts += [f"## Release to stored against `zstd -1 -T1` on the same core ({a.runs} runs)\n",
                              table]
                    misses += missed
                if a.during:
                    table, missed = capture_during_compression(daemon, crashes, a.small, a.big, a.runs)
                    parts += [f"## A capture during a big compression against the same on an idle daemon "
                              f"({a.runs} pairs, alternating order)\n", table]
                    misses += missed
            finally:
                daemon.stop()
            if a.upload:
                tables, missed = during_upload(a, lent)
                parts += [f"## A capture during an upload against the same on an idle daemon ({a.runs} pairs, "
                          "alternating order)\n", *tables]
                misses += missed
    finally:
        shutil.rmtree(a.work, ignore_errors=True)
    parts.append(f"After: {describe_cache(page_cache_state())}.\n")
    parts.append("Goals missed: " + "; ".join(misses) + ".\n" if misses else "Every goal met.\n")
    parts.append(NOTES)
    publish(a.out, "\n".join(parts))
    return 0


NOTES = """\
## Reading the numbers
- "release → stored" includes everything the daemon does after the reaping: validation, the analysis (in its
  workers, beside the compression), the zstd frame, the sha256, the verifying decompression, fsync and rename,
  the index row. zstd alone does the compression only, from the page cache.
- The zstd workers are the count `threads = "auto"` gave the dump: one per CPU the daemon may run on, at its
  lower priority (nice 5), so that they take only what the host's other work leaves (corehandler/idlecpus.py).
- A hold during a compression is the capture's priority at work: the daemon pauses its feed while csplice's
  `.tmp.ID.core` grows (corehandler/capture.py), so its zstd workers idle after the few MiB they hold, and
  meanwhile every thread of the daemon runs SCHED_IDLE (corehandler/idlecpus.py), so those MiB take only a
  CPU the capture leaves idle.
- A hold during an upload: the uploader asks the same gate before it reads a part, before it hashes one and
  after every MiB a part sends (fleet/transfer.py), so a part on the wire when the crash comes stands still
  within a MiB (at most 10 s, less than a server lets a request idle). The server is weed mini on this host:
  as a neighbour on the same 2 CPUs and disk, it goes on storing the parts it has already received while
  csplice captures (no gate of ours reaches it); held to a tenth of a CPU by a cgroup, it stands in for a
  bucket on another host, where the uploader's own work (reading, hashing, sending) is all this host pays.
- "captures moved to O_DIRECT": how many of the small crash's captures csplice's rw handed to O_DIRECT part
  way (its record's capture.direct_from), on the idle and on the busy daemon.
"""


if __name__ == "__main__":
    sys.exit(main())
