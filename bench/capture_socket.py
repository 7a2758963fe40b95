"""Socket mode against pipe mode: how long the kernel holds a crashed process, and what a crash storm costs.

Live kernel (root; takes the core_pattern lock, restores everything). Handlers, interleaved per round:
  none          RLIMIT_CORE 0 and a file core_pattern: the kernel dumps nothing (the no-handler floor)
  null          a pipe handler that splices the core to /dev/null: the kernel's own cost of writing the dump
  pipe          csplice in pipe mode ("|csplice %P ..."), its default settings
  socket        csplice's listener ("@@socket"), one forked csplice per crash
  socket-exec   the listener with --exec: each crash's csplice exec'd fresh, as systemd's Accept=yes does
  systemd       systemd-coredump in pipe mode, this machine's baseline (its own defaults; no systemd running)
Workloads: a tiny crash, 256 MiB and 1 GiB dense, a 1 GiB crash that csplice refuses (max_dump_size 64M: socket
mode REJECTs it before the kernel writes it, pipe mode truncates and drains), and a storm of 200 tiny crashes
triggered at once (csplice's default limits: 16 a minute per executable keep their core), for which the total
hold, the CPU the handlers used and the peak number of handler processes are reported.

Clock: crash trigger to the parent reaping the process (os.wait4), the whole time the kernel holds it. Handler
CPU in the storm: the machine's busy time (/proc/stat) over the storm less the crashers' own (their rusage,
which includes the kernel's dump writing) and less the same difference in the same round's no-handler storm;
the machine is shared, so it is an estimate, spread shown.

    python -P bench/capture_socket.py [--rounds 5] [--out bench/results/capture-socket.md]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from common import csplice_settings, filesystem_of, machine, markdown_table, median, paired_ratio  # noqa: E402

from corehandler import paths  # noqa: E402
from corehandler.host import listener  # noqa: E402
from support.crash import build_crasher  # noqa: E402
from support.host_core import borrowed  # noqa: E402

MiB = 1 << 20
SOCKET = Path("/run/corehandler-bench/capture/coredump.socket")
SYSTEMD_COREDUMP = "/lib/systemd/systemd-coredump"
HANDLERS = ("none", "null", "pipe", "socket", "socket-exec", "systemd")
CSPLICE_HANDLERS = ("pipe", "socket", "socket-exec")
HANDLER_NAMES = {"csplice", "systemd-coredum"}  # comm of the handler processes (15 characters)
STORM = 200


def settings(spool: Path, **extra) -> str:
    return csplice_settings(spool, **{"min_free": 0, **extra})


class Bench:
    def __init__(self, work: Path):
        self.work = work
        self.spool = work / "spool"
        self.crasher = build_crasher(work / "bin")
        self.baselines = work / "bin" / "baselines"
        subprocess.run(["gcc", "-O2", "-o", str(self.baselines), str(HERE / "baselines.c")], check=True)
        self.csplice = paths.csplice_path()
        self.listener: subprocess.Popen | None = None
        self.lent = None  # the borrowed handler (support/host_core.py), while run() holds it

    def clean(self) -> None:
        shutil.rmtree(self.spool, ignore_errors=True)
        shutil.rmtree("/var/lib/systemd/coredump", ignore_errors=True)

    def start_listener(self, exec_each: bool) -> None:
        argv = listener.command(self.csplice, SOCKET, 16) + (["--exec"] if exec_each else [])
        self.listener = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        if not listener.wait_listening(SOCKET, 10):
            raise SystemExit("the listener did not come up")

    def stop_listener(self) -> None:
        if self.listener is not None:
            self.listener.terminate()
            self.listener.wait(10)
            self.listener = None

    def use(self, handler: str, **limits) -> None:
        """core_pattern and csplice.conf for handler."""
        self.stop_listener()
        self.lent.write_settings(settings(self.spool, **limits))
        if handler == "none":
            pattern = str(self.work / "no-core.%p")
        elif handler == "null":
            pattern = f"|{self.baselines} null"
        elif handler == "pipe":
            pattern = f"|{self.csplice} %P %i %I %u %g %d %s %t %c %h %e %F"
        elif handler == "systemd":
            pattern = f"|{SYSTEMD_COREDUMP} %P %u %g %s %t %c %h"
        else:
            self.start_listener(exec_each=handler == "socket-exec")
            pattern = f"@@{SOCKET}"
        self.lent.point(pattern, 16)

    def spawn(self, handler: str, mib: int) -> subprocess.Popen:
        rlimit = 0 if handler == "none" else resource.RLIM_INFINITY

        def limit():
            resource.setrlimit(resource.RLIMIT_CORE, (rlimit, resource.RLIM_INFINITY))

        proc = subprocess.Popen([str(self.crasher), "segv", str(mib), "--wait"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, preexec_fn=limit)
        proc.stdout.readline()  # memory filled, waiting for the go
        return proc

    def crash(self, handler: str, mib: int) -> float:
        proc = self.spawn(handler, mib)
        t0 = time.perf_counter()
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        _, status, _ = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t0
        proc.returncode = -1
        proc.stdin.close()
        proc.stdout.close()
        if not os.WIFSIGNALED(status):
            raise SystemExit(f"crasher did not die: {status:#x}")
        return elapsed

    def storm(self, handler: str) -> dict:
        procs = [self.spawn(handler, 1) for _ in range(STORM)]
        peak = PeakCounter()
        busy0, self0 = busy_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        for p in procs:
            p.stdin.write(b"\n")
            p.stdin.flush()
        holds = []
        for _ in procs:
            os.wait4(-1, 0)
            holds.append(time.perf_counter() - t0)
        total = time.perf_counter() - t0
        # The handlers outlive the last reap by their record's commit; let them finish before counting CPU.
        peak.settle()
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        crasher_cpu = (kids.ru_utime + kids.ru_stime) - (self0.ru_utime + self0.ru_stime)
        for p in procs:
            p.returncode = -1
            p.stdin.close()
            p.stdout.close()
        return {"total": total, "median_hold": median(holds), "peak": peak.stop(),
                "cpu": busy_seconds() - busy0 - crasher_cpu}

    def records(self) -> list[tuple[int, int]]:
        """(csplice's start, its record's commit) of every record: one per crash the kernel handed over."""
        found = []
        for path in self.spool.glob("*.json") if self.spool.exists() else []:
            found.append((json.loads(path.read_text())["handler"]["started_realtime_ns"], path.stat().st_mtime_ns))
        return found


def peak_overlap(intervals: list[tuple[int, int]]) -> int:
    """The most intervals open at once: csplice processes alive together, from their records (a sampler of
    /proc misses processes that live a millisecond)."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    peak = live = 0
    for _, step in events:
        live += step
        peak = max(peak, live)
    return peak


def busy_seconds() -> float:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class PeakCounter:
    """The most handler processes alive at once beyond those alive before (a listener), sampled every
    millisecond in a thread."""

    def __init__(self):
        self.baseline = self.count()
        self.peak = self.baseline
        self.running = True
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    @staticmethod
    def count() -> int:
        n = 0
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    n += Path(f"/proc/{pid}/comm").read_text().strip() in HANDLER_NAMES
                except OSError:
                    pass
        return n

    def run(self):
        while self.running:
            self.peak = max(self.peak, self.count())
            time.sleep(0.001)

    def settle(self, timeout: float = 60.0):
        """Waits for the handlers to finish (they commit their record after the process is let go)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.count() > self.baseline:
            time.sleep(0.01)

    def stop(self) -> int:
        self.running = False
        self.thread.join()
        return self.peak - self.baseline


def rotated(items, k: int) -> list:
    k %= len(items)
    return list(items[k:]) + list(items[:k])


def run(args) -> dict:
    bench = Bench(args.work)
    sizes = {"tiny (1 MiB)": 1, "256 MiB dense": 256, "1 GiB dense": 1024}
    holds = {w: {h: [] for h in HANDLERS} for w in [*sizes, "1 GiB refused (max 64M)"]}
    storms = {h: [] for h in HANDLERS}
    with borrowed("bench/capture_socket.py") as bench.lent:
        try:
            for r in range(args.rounds):
                for handler in rotated(HANDLERS, r):
                    # Limits off for the hold times: every crash here is meant to be captured.
                    bench.use(handler, max_pending=0, max_per_exe_per_minute=0)
                    for workload, mib in sizes.items():
                        if mib > 1 and workload != "tiny (1 MiB)" and args.quick:
                            continue
                        holds[workload][handler].append(bench.crash(handler, mib))
                        bench.clean()
                    if handler in CSPLICE_HANDLERS:
                        bench.use(handler, max_pending=0, max_per_exe_per_minute=0, max_dump_size=64 * MiB)
                        holds["1 GiB refused (max 64M)"][handler].append(bench.crash(handler, 1024))
                        bench.clean()
                    # The storm with csplice's default limits (16 a minute per executable keep their core).
                    bench.use(handler)
                    result = bench.storm(handler)
                    if handler in CSPLICE_HANDLERS:
                        records = bench.records()
                        result.update(records=len(records), peak=peak_overlap(records))
                    storms[handler].append(result)
                    bench.clean()
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
            # More rounds of what the goals are read from, in the same pairing (each list grows by one per
            # round, so sample i of one handler and of its floor are still from the same round).
            for r in range(args.goal_rounds):
                for handler in rotated(("none", "null", "pipe", "socket"), r):
                    bench.use(handler, max_pending=0, max_per_exe_per_minute=0, max_dump_size=64 * MiB)
                    holds["tiny (1 MiB)"][handler].append(bench.crash(handler, 1))
                    bench.clean()
                    if handler == "none":
                        holds["1 GiB dense"][handler].append(bench.crash(handler, 1024))
                    elif handler in CSPLICE_HANDLERS:
                        holds["1 GiB refused (max 64M)"][handler].append(bench.crash(handler, 1024))
                    bench.clean()
        finally:
            bench.stop_listener()
            bench.clean()
    return {"holds": holds, "storms": storms}


def spread(values: list[float], scale: float = 1e3) -> str:
    return f"{median(values) * scale:.2f} ({min(values) * scale:.2f}–{max(values) * scale:.2f})"


def report(results: dict, args) -> str:
    holds, storms = results["holds"], results["storms"]
    out = ["# Socket mode against pipe mode: hold time and crash storms\n",
           f"Generated by `bench/capture_socket.py` on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC.",
           f"Machine: {machine()}; spool on {filesystem_of(args.work)}. Loaded by other engineers' builds and "
           f"tests: load average {args.load_before} at the start, {os.getloadavg()[0]:.2f} at the end.",
           f"Medians (min–max) of {args.rounds} rounds, handlers interleaved in a different order each round; "
           f"the tiny and refused crashes and their floors (none, null, pipe, socket) {args.goal_rounds} rounds more. "
           "core_pipe_limit 16.\n",
           "## Hold: crash trigger to reaped, ms\n"]
    rows = []
    for workload, by_handler in holds.items():
        row = [workload]
        for h in HANDLERS:
            s = by_handler[h]
            row.append(spread(s) if s else "—")
        rows.append(row)
    out.append(markdown_table(["workload", *HANDLERS], rows))
    out.append("## Storm: 200 tiny crashes of one executable, triggered at once\n")
    none_cpu = [s["cpu"] for s in storms["none"]]
    rows = []
    for h in HANDLERS:
        s = storms[h]
        cpu = [x["cpu"] - n for x, n in zip(s, none_cpu)]
        records = [x.get("records", 0) for x in s]
        rows.append([h, spread([x["total"] for x in s]), spread([x["median_hold"] for x in s]),
                     spread(cpu) if h != "none" else "0 (reference)", max(x["peak"] for x in s),
                     f"{min(records)}–{max(records)}" if h in CSPLICE_HANDLERS else "—"])
    out.append(markdown_table(["handler", "total hold, ms", "median hold, ms", "handler CPU, ms",
                               "peak handler processes", "csplice records of 200"], rows))
    tiny = holds["tiny (1 MiB)"]
    out.append(GOALS.format(tiny_none=over(tiny["socket"], tiny["none"]), tiny_null=over(tiny["socket"], tiny["null"]),
                            pipe_null=over(tiny["pipe"], tiny["null"]),
                            refused=over(holds["1 GiB refused (max 64M)"]["socket"], holds["1 GiB dense"]["none"]),
                            refused_pipe=over(holds["1 GiB refused (max 64M)"]["pipe"], holds["1 GiB dense"]["none"])))
    return "\n".join(out)


def over(samples: list[float], floor: list[float]) -> str:
    """Median (min–max) of the round-by-round differences, ms."""
    return spread([a - b for a, b in zip(samples, floor)])


GOALS = """
## Against the goals
- A tiny crash in socket mode costs {tiny_none} ms over the no-handler floor ("none"), {tiny_null} ms over
  the kernel writing the same dump to a handler that throws it away ("null"); pipe mode {pipe_null} ms over
  "null" (round-by-round differences, median (min–max); goal ≤ 1 ms over the floor).
- A refused 1 GiB dump holds its process {refused} ms longer than the same process dying without a dump
  ("none", 1 GiB dense) in socket mode (goal ≤ 5 ms): csplice answers REJECT before the kernel writes a byte.
  Pipe mode can only truncate at the limit and drain the rest: {refused_pipe} ms.

## Reading the numbers
- A 1 GiB process takes over 100 ms to die even without a dump (the kernel frees its memory before the parent
  can reap it), so hold times of refused dumps are read against that, not against zero.
- "none" is RLIMIT_CORE 0 with a file core_pattern: the kernel skips the dump, so it is the cost of the crash
  itself (signal delivery, exit, reaping), which every handler pays too.
- socket vs socket-exec is the listener's choice: fork only (csplice --listen) against a fresh exec per crash,
  which is what systemd's Accept=yes costs at least (it also sets up a unit per connection). corehandler's
  supervisor runs the forking listener; corehandler-capture.socket is for systemd hosts.
- systemd-coredump runs here without systemd as PID 1 and without journald: it still reads and writes each
  core (compressed, into /var/lib/systemd/coredump) before it lets the process go; on a systemd host it would
  also send to the journal.
- csplice writes a record for every crash it is handed, kept or refused. Fewer than 200 records means the
  kernel never handed the crash over: in pipe mode it skips a dump outright (no handler, no record, only a
  kernel log line) while core_pipe_limit (16) handlers are running.
- Peak handler processes: for csplice counted from its records (start to commit overlapping), so exact; for
  systemd-coredump sampled from /proc every millisecond, which can miss the shortest-lived.
- The machine is shared: the CPU column is a difference of machine-wide busy time and can be off by the other
  users' load; compare within a round, not across tables.
"""


# ---- the kernel's send buffer: what socket mode's large dumps wait on ----

WMEM_DEFAULT = Path("/proc/sys/net/core/wmem_default")
BUFFER_HANDLERS = ("null", "pipe", "socket", "socket+sndbuf")


@contextlib.contextmanager
def send_buffer(size: int | None):
    """net.core.wmem_default at size for the block (None: as it is), put back on every exit. The kernel's own
    end of the coredump socket is made with it; no option of the listener's end reaches it."""
    before = WMEM_DEFAULT.read_text()
    try:
        if size:
            WMEM_DEFAULT.write_text(str(size))
        yield
    finally:
        WMEM_DEFAULT.write_text(before)


def buffer_experiment(args) -> str:
    """1 GiB and 256 MiB dense crashes held by csplice as install renders its settings on this host, in pipe mode
    (its 1 MiB pipe) and in socket mode with the kernel's default send buffer and with one as large as that pipe;
    null is the pipe drain floor."""
    from capture import default_tuning, measure_rates_into  # noqa: PLC0415

    bench = Bench(args.work)
    tuning = default_tuning(measure_rates_into(args.work / "state"))
    pipe_bytes = int(tuning["pipe_size"])
    sizes = {"256 MiB dense": 256, "1 GiB dense": 1024}
    holds = {w: {h: [] for h in BUFFER_HANDLERS} for w in sizes}
    kernel_default = int(WMEM_DEFAULT.read_text())
    with borrowed("bench/capture_socket.py") as bench.lent:
        try:
            for r in range(args.rounds):
                for handler in rotated(BUFFER_HANDLERS, r):
                    bench.use(handler.split("+")[0], max_pending=0, max_per_exe_per_minute=0, **tuning)
                    with send_buffer(pipe_bytes if handler == "socket+sndbuf" else None):
                        for workload, mib in sizes.items():
                            holds[workload][handler].append(bench.crash(handler, mib))
                            bench.clean()
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            bench.stop_listener()
            bench.clean()
    rows = []
    for workload, by in holds.items():
        rows.append([workload] + [spread(by[h]) for h in BUFFER_HANDLERS] +
                    [f"{paired_ratio(by[h], by['pipe']):.2f}" for h in ("socket", "socket+sndbuf")])
    return "\n".join([
        "# Socket mode's large dumps and the kernel's send buffer\n",
        f"Generated by `bench/capture_socket.py --send-buffer --rounds {args.rounds}` on "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC.",
        f"Machine: {machine()}; spool on {filesystem_of(args.work)}; load average {args.load_before} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end. csplice ran with the settings `corehandler install` renders here: "
        f"`{' '.join(f'{k}={v}' for k, v in tuning.items())}`. Medians (min–max) of {args.rounds} interleaved "
        "rounds, ms, crash trigger to reaped; ratios are medians of round-by-round ratios.\n",
        markdown_table(["workload", "null (pipe drain floor)", "pipe", f"socket (send buffer {kernel_default})",
                        f"socket (send buffer {pipe_bytes})", "socket ÷ pipe", "socket with the larger buffer ÷ pipe"],
                       rows),
        "The kernel writes the dump into its own end of the connection, a socket it creates with "
        "net.core.wmem_default as its send buffer; a unix stream sender waits whenever that much is queued unread. "
        "The listener's end has no option that changes it (its SO_RCVBUF does not bound a unix stream peer), so "
        "the larger buffer is measured by raising net.core.wmem_default for the crash, host-wide, and putting it "
        "back.\n"])


# ---- the socket stream without the kernel: which capture strategy reads a unix socket fastest ----

FEED_STRATEGIES = ("rw", "splice", "rw2", "splice2")


def feed_once(work: Path, strategy: str, data: bytes) -> tuple[float, str]:
    """csplice captures data from a socketpair (the test hook plays the kernel's peer); returns the seconds
    from the first byte sent to csplice's exit, and the strategy that really ran (splice falls back)."""
    import socket

    spool = work / "feed-spool"
    shutil.rmtree(spool, ignore_errors=True)
    conf = work / "feed.conf"
    conf.write_text(settings(spool, max_pending=0, max_per_exe_per_minute=0, strategy=strategy))
    ours, theirs = socket.socketpair()
    env = {"CSPLICE_SETTINGS": str(conf), "CSPLICE_TEST_SOCKETPAIR_PEER": "1"}
    proc = subprocess.Popen([str(paths.csplice_path())], stdin=theirs, env=env)
    theirs.close()
    t0 = time.perf_counter()
    ours.sendall(data)  # plain "@": no handshake, the core straight away
    ours.shutdown(socket.SHUT_WR)
    proc.wait(120)
    elapsed = time.perf_counter() - t0
    ours.close()
    record = json.loads(next(spool.glob("*.json")).read_text())
    if not record["capture"]["complete"] or record["capture"]["bytes"] != len(data):
        raise SystemExit(f"{strategy}: incomplete capture {record['capture']}")
    shutil.rmtree(spool, ignore_errors=True)
    return elapsed, record["capture"]["strategy"]


def feed(args) -> str:
    # The peer csplice sees is this process: its RLIMIT_CORE is the "crashed" process's.
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    data = bytearray(os.urandom(1 << 20)) * (args.feed_mib)
    data[:4] = b"\x7fELF"
    data = bytes(data)
    samples = {s: [] for s in FEED_STRATEGIES}
    ran = {}
    for r in range(args.feed_rounds):
        for strategy in rotated(FEED_STRATEGIES, r):
            seconds, ran[strategy] = feed_once(args.work, strategy, data)
            samples[strategy].append(seconds)
    rows = [[f"{s} (ran: {ran[s]})", spread(v), median([a / b for a, b in zip(v, samples["rw"])])]
            for s, v in samples.items()]
    return "\n".join([
        "# csplice reading the coredump socket: capture strategies\n",
        f"Generated by `bench/capture_socket.py --feed` on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC.",
        f"Machine: {machine()}; spool on {filesystem_of(args.work)}; load average {os.getloadavg()[0]:.2f} (other "
        f"engineers' work). {args.feed_mib} MiB of incompressible data sent over a unix socketpair to csplice "
        "(socket mode, plain `@`: no handshake), first byte to csplice's exit; medians (min–max) of "
        f"{args.feed_rounds} interleaved rounds, ratio paired against rw.\n",
        markdown_table(["strategy", "ms", "× rw"], rows),
        "splice() cannot move from a socket straight into a file (one side must be a pipe): the one-stage splice "
        "falls back to rw; splice2 splices the socket into a private pipe and that pipe into the file.\n"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny crashes and the storm only")
    parser.add_argument("--goal-rounds", type=int, default=8, help="extra rounds of the tiny and refused crashes "
                        "and their floors, the goals' figures")
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/corehandler-bench-socket"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "capture-socket.md")
    parser.add_argument("--feed", action="store_true", help="only the strategies on a socketpair (no root, no "
                        "lock): bench/results/capture-socket-feed.md")
    parser.add_argument("--send-buffer", action="store_true", help="only large dumps in pipe and socket mode, the "
                        "latter with the kernel's default send buffer and one of csplice's pipe size: "
                        "bench/results/capture-socket-buffer.md")
    parser.add_argument("--feed-mib", type=int, default=256)
    parser.add_argument("--feed-rounds", type=int, default=7)
    args = parser.parse_args()
    if args.feed:
        args.work.mkdir(parents=True, exist_ok=True)
        text = feed(args)
        (HERE / "results" / "capture-socket-feed.md").write_text(text)
        print(text)
        return 0
    if listener.socket_prefix() != "@@":
        raise SystemExit("this kernel has no @@ core_pattern (Linux 6.17+)")
    args.load_before = f"{os.getloadavg()[0]:.2f}"
    args.work.mkdir(parents=True, exist_ok=True)
    if args.send_buffer:
        text = buffer_experiment(args)
        (HERE / "results" / "capture-socket-buffer.md").write_text(text)
        print(text)
        return 0
    results = run(args)
    text = report(results, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    raw = args.out.parent / "raw" / (args.out.stem + ".json")
    raw.parent.mkdir(exist_ok=True)
    raw.write_text(json.dumps({**results, "args": vars(args)}, indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
