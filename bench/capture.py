"""How long does each core_pattern handler hold a crashed process?

Live kernel (root; takes the core_pattern lock, restores everything): real processes of 64 MiB, 256 MiB, 1 GiB
and 4 GiB, dense and half untouched, crash with core_pipe_limit 16; the clock runs from the crash trigger to the
parent reaping the process (os.wait4), i.e. the whole time the kernel holds it. Handlers: csplice as the default
config renders it on this host (`auto`: the kernel's strategy, and direct from the direct_above that the spool's
write rates, measured at the start as install measures them, choose), direct forced, systemd-coredump with
Compress=yes (its own store in a private namespace), and the floors: splice() to /dev/null on a pipe enlarged to
csplice's pipe_size (the kernel's own drain), and, in the same round, the spool filesystem's O_DIRECT write of as
many bytes without any crash; the physical floor of a round is the larger of the two, and the default's hold is
given against it per round, median and worst. An optional read floor (`--methods ...,read`): the pipe read()
into one buffer and checked for zeros, nothing written: what any handler that keeps holes pays over the drain.
Twice: on a quiet page cache and on a busy one (about RAM's worth of other files written first, some still
dirty). A tiny process measures the per-crash overhead against no dump
at all and the bare drain. --quick (before every change to csplice): 64 MiB to 1 GiB, quiet page cache only.

Feeder (no root): the same csplice strategies behind the feeder's write() path (a stock kernel) and vmsplice()
path (a COREDUMP_USE_PIPE kernel); the clock runs from the first byte pushed to the handler's exit.

Rounds interleave every workload and handler (a different order per round); ratios are round-by-round ratios
against the same round's floors, given as p50, p90 and the worst of the rounds (10 by default), and the
default's worst round per crash is broken down by csplice's own trace of it (its record's capture.phases: the
kernel's part before csplice started, each of csplice's steps, the kernel's part after the release). Writes
bench/results/capture.md and capture.png.

    python -P bench/capture.py [--runs 10] [--quick] [--no-busy] [--no-live] [--no-feeder]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import common  # noqa: E402
from common import (  # noqa: E402
    describe_cache,
    filesystem_of,
    machine,
    markdown_table,
    median,
    page_cache_state,
    paired_ratio,
    plot_holds,
    spread,
)
from sdcd import systemd_coredump  # noqa: E402

from corehandler import paths  # noqa: E402
from corehandler.config import CaptureConfig  # noqa: E402
from corehandler.csplice_contract import PHASES, PIDFD_SPECIFIER, SPECIFIERS, settings_values  # noqa: E402
from corehandler.host import handler, writerates  # noqa: E402
from corehandler.paths import Host  # noqa: E402
from support import cbuild  # noqa: E402
from support.crash import build_crasher  # noqa: E402
from support.host_core import borrowed  # noqa: E402
from support.waiting import wait_for  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
CORE_PIPE_LIMIT = "16"
FLOOR = "null"
READ = "read"
ODIRECT = "odirect"
BOTH = "both"
SPLICE_DIRECT = "splicedirect"
SDCD = "systemd-coredump"
NODUMP = "nodump"
DEFAULT = "default"
DEFAULT_RW = "default-rw"
DEFAULT_RT = "default-rt"
RW_LOOP = "loop"


def default_tuning(state: paths.Paths) -> dict:
    """csplice.conf's capture keys as the default config renders them on this kernel, with the write rates
    measured into state (the bench's own state dir: install and the daemon measure the same way)."""
    values = settings_values(CaptureConfig(), state.spool_dir, handler.facts(Host(), state))
    keys = ("strategy", "chunk_size", "pipe_size", "direct_above", "direct_rate", "sparse", "io_realtime")
    return {k: values[k] for k in keys}


def default_variants(default: dict) -> dict:
    """Experiments on the default: without its move to direct (what the move gains or costs per crash), and with
    its writes in the realtime I/O class ([capture] io_realtime)."""
    return {DEFAULT_RW: {**default, "direct_above": 0, "direct_rate": 0}, DEFAULT_RT: {**default, "io_realtime": True}}


# Until main() has measured this host: the default as an unmeasured host renders it.
DEFAULT_TUNING = default_tuning(paths.Paths(state_dir=Path("/nonexistent")))
PIPE_BYTES = int(DEFAULT_TUNING["pipe_size"])
# csplice as it can be configured: strategy, bytes per system call, core pipe size (0 = the kernel's 64 KiB).
CSPLICE = {
    DEFAULT: DEFAULT_TUNING,
    "rw-256K-1M": {"strategy": "rw", "chunk_size": 256 * 1024, "pipe_size": MiB, "direct_above": 0},
    **default_variants(DEFAULT_TUNING),
    "direct": {"strategy": "direct", "chunk_size": 256 * 1024, "pipe_size": MiB},
    "rw": {"strategy": "rw", "chunk_size": 64 * 1024, "pipe_size": 0, "direct_above": 0},
    "splice": {"strategy": "splice", "chunk_size": 64 * 1024, "pipe_size": 0, "direct_above": 0},
    "rw2-1M": {"strategy": "rw2", "chunk_size": MiB, "pipe_size": MiB, "direct_above": 0},
    "splice2-256K-1M": {"strategy": "splice2", "chunk_size": 256 * 1024, "pipe_size": MiB,
                        "direct_above": 0},
}


def default_label(tuning: dict) -> str:
    above, rate = int(tuning["direct_above"]), int(tuning.get("direct_rate", 0))
    direct = f"direct from {above // MiB} MiB resident" if above else "direct_above off"
    if rate:
        direct = f"moving to direct within a dump below 3/4 of {rate // MiB} MiB/s, {direct}"
    return f"**csplice default** (auto: {tuning['strategy']}, {direct})"


LABELS = {
    DEFAULT: default_label(DEFAULT_TUNING),
    "rw-256K-1M": "csplice rw, 256K chunk, 1M pipe (v0.1's default)",
    DEFAULT_RW: "csplice default's rw, never moving to direct",
    DEFAULT_RT: "csplice default with io_realtime on (its writes in the realtime I/O class)",
    "direct": "csplice direct (O_DIRECT, 2 MiB slots, 2 writes in flight), every size",
    "rw": "csplice rw, 64K chunk, kernel's 64K pipe",
    "splice": "csplice splice (the 16-page splice loop)",
    "rw2-1M": "csplice rw2 (2 threads, 4x1M ring), 1M pipe",
    "splice2-256K-1M": "csplice splice2 (2-stage splice), 1M pipes",
    SDCD: "systemd-coredump, Compress=yes",
    RW_LOOP: "plain read/write loop, 64K",
    FLOOR: f"splice -> /dev/null, {PIPE_BYTES // MiB} MiB pipe (drain floor)",
    ODIRECT: "O_DIRECT write of as many bytes, 8 MiB blocks, no crash (disk floor, dd-like)",
    BOTH: "the drain floor's crash with the O_DIRECT floor's write running alongside, from the trigger until both "
          "are done (the two floors at once on this machine's CPUs and disk)",
    READ: f"read() -> one 256 KiB buffer, each 4 KiB block checked for zeros, nothing written, {PIPE_BYTES // MiB} "
          "MiB pipe (what looking at the bytes costs over the drain floor)",
    SPLICE_DIRECT: "splice() into a file opened O_DIRECT, 1 MiB a call (experiment: no copy, one write in flight)",
    NODUMP: "no dump at all (RLIMIT_CORE 0)",
}
SHORT = {FLOOR: "drain floor", READ: "read floor", ODIRECT: "O_DIRECT floor", BOTH: "both floors at once",
         SPLICE_DIRECT: "splice to O_DIRECT", DEFAULT: "**csplice default**",
         "rw-256K-1M": "csplice rw (v0.1)", DEFAULT_RW: "default, rw only", DEFAULT_RT: "default, io_realtime on",
         "direct": "csplice direct",
         SDCD: "systemd-coredump"}
LIVE_METHODS = (FLOOR, ODIRECT, BOTH, DEFAULT, "direct", SDCD)
TINY_METHODS = (NODUMP, FLOOR, DEFAULT)
FEEDER_METHODS = (DEFAULT, "rw-256K-1M", "direct", "rw2-1M", "splice2-256K-1M", RW_LOOP, FLOOR)


def csplice_settings(spool: Path, tuning: dict) -> str:
    # Limits off: a benchmark is a crash storm by design; no free-space floor (the busy page cache's files).
    return common.csplice_settings(spool, **{"max_pending": 0, "max_per_exe_per_minute": 0, "min_free": 0,
                                             "sparse": "yes", **tuning})


class Tools:
    """The programs a benchmark runs, built once under work."""

    def __init__(self, work: Path):
        self.work = work
        self.bin = work / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.crasher = build_crasher(self.bin)
        self.baselines = self.bin / "baselines"
        subprocess.run(["gcc", "-O2", "-o", str(self.baselines), str(HERE / "baselines.c")], check=True)
        self.csplice = paths.csplice_path()
        self.feeder = cbuild.feeder()
        self.spool = work / "spool"
        self.out = work / "out"
        self.out.mkdir(exist_ok=True)
        self.filler = work / "busy"

    def handler_argv(self, method: str, target: str) -> list[str]:
        """The handler's command line; target names the output file (the kernel expands %P in it)."""
        if method in CSPLICE:
            return [str(self.csplice)]
        if method == RW_LOOP:
            return [str(self.baselines), "rw", target]
        if method == SPLICE_DIRECT:
            return [str(self.baselines), SPLICE_DIRECT, target, str(PIPE_BYTES)]
        if method == READ:
            return [str(self.baselines), READ, str(PIPE_BYTES)]
        return [str(self.baselines), "null", str(PIPE_BYTES)]

    def clean(self) -> None:
        # Delete each core at once: its dirty pages are dropped instead of written back under the next run.
        for d in (self.spool, self.out):
            shutil.rmtree(d, ignore_errors=True)
        self.out.mkdir()

    def check(self, method: str, size: int, pid: int) -> tuple[list | None, dict | None]:
        """The handler really captured the dump of pid (a benchmark of a failing handler measures nothing; any
        other process crashing on this shared machine meanwhile lands in the spool too); returns the strategy
        csplice ran and the MiB from which rw handed the dump to direct (None if it did not), and csplice's own
        trace of the hold (its record's capture.phases, the longest read and write, its start)."""
        if method in CSPLICE:
            def mine():
                for f in self.spool.glob("*.json"):
                    record = json.loads(f.read_text())
                    if record["pid"] == pid:
                        return record
                return None

            record = wait_for(mine, 30, f"{method}'s record", interval=0.002)
            cap = record["capture"]
            if not cap["complete"] or cap["bytes"] < size:
                raise SystemExit(f"{method}: capture incomplete: {cap}")
            at = cap.get("direct_from")
            trace = {k: cap.get(k) for k in ("phases", "longest_read_ns", "longest_write_ns")}
            trace["started_realtime_ns"] = record["handler"]["started_realtime_ns"]
            return [cap["strategy"], None if at is None else at // MiB], trace
        if method in (RW_LOOP, SPLICE_DIRECT):
            files = list(self.out.iterdir())
            if not files or files[0].stat().st_size < size:
                raise SystemExit(f"{method}: core missing or short: {files}")
        return None, None

    def fill_page_cache(self, total: int) -> None:
        """A busy server's page cache: `total` bytes of other files, the last of them still dirty."""
        self.filler.mkdir(exist_ok=True)
        block = bytes(range(256)) * (64 * MiB // 256)
        for i in range(max(1, total // GiB)):
            with open(self.filler / f"f{i}", "wb") as f:
                for _ in range(GiB // len(block)):
                    f.write(block)

    def drop_filler(self) -> None:
        shutil.rmtree(self.filler, ignore_errors=True)


def rotated(methods, run: int) -> list:
    k = run % len(methods)
    return list(methods[k:]) + list(methods[:k])


# ---- live kernel ----

def allow_core():
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def forbid_core():
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def crash_once(tools: Tools, mib: int, half: bool, dump: bool = True, alongside: list[str] | None = None
               ) -> tuple[float, int, int]:
    """Seconds from the crash trigger to the reaping of the crashed process, its PID, and the trigger's
    CLOCK_REALTIME ns (csplice's record tells its own start on that clock); with alongside, to the later of the
    reaping and the exit of alongside, a command started with the trigger."""
    argv = [str(tools.crasher), "segv", str(mib), "--wait"] + (["--untouched-half"] if half else [])
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            preexec_fn=allow_core if dump else forbid_core)
    proc.stdout.readline()  # memory filled, waiting for the go
    # Started before the clock: a Popen takes ~4 ms here, which would count against the floor; the write's
    # head start (from its exec to the trigger) counts for it instead, the stricter side for a baseline.
    other = subprocess.Popen(alongside, stdout=subprocess.DEVNULL) if alongside else None
    trigger_ns = time.time_ns()
    t0 = time.perf_counter()
    proc.stdin.write(b"\n")
    proc.stdin.flush()
    _, status, _ = os.wait4(proc.pid, 0)
    if other and other.wait() != 0:
        raise SystemExit(f"{alongside} failed")
    elapsed = time.perf_counter() - t0
    proc.returncode = -1  # reaped above; keep Popen from waiting again
    proc.stdin.close()
    proc.stdout.close()
    if not os.WIFSIGNALED(status) or os.WTERMSIG(status) != 11:
        raise SystemExit(f"crasher did not die of SIGSEGV: status {status:#x}")
    return elapsed, proc.pid, trigger_ns


def odirect_once(tools: Tools, size: int) -> float:
    out = subprocess.run([str(tools.baselines), "odirect", str(tools.out / "odirect"), str(size)],
                         capture_output=True, text=True, check=True).stdout
    return float(out)


def measure(tools: Tools, lent, method: str, mib: int, half: bool, sdcd) -> tuple[float, list | None, dict | None]:
    """One crash of method's: its hold, and for csplice the strategy it ran and its trace of the hold (the
    trigger's time added); lent: the borrowed handler (host/handler.py borrow()) that points the kernel."""
    written = mib * MiB // 2 if half else mib * MiB  # half untouched: the rest is zeros, holes in the file
    if method == ODIRECT:
        return odirect_once(tools, written), None, None
    if method == BOTH:
        lent.point("|" + " ".join(tools.handler_argv(FLOOR, "")), CORE_PIPE_LIMIT)
        dd = [str(tools.baselines), "odirect", str(tools.out / "odirect"), str(written)]
        return crash_once(tools, mib, half, alongside=dd)[0], None, None
    if method == SDCD:
        lent.point(sdcd.pattern, CORE_PIPE_LIMIT)
        hold = crash_once(tools, mib, half)[0]
        sdcd.wait_stored()
        return hold, None, None
    if method == NODUMP:
        lent.point("core", CORE_PIPE_LIMIT)
        return crash_once(tools, mib, half, dump=False)[0], None, None
    argv = tools.handler_argv(method, str(tools.out / "core.%P"))
    if method in CSPLICE:
        lent.write_settings(csplice_settings(tools.spool, CSPLICE[method]))
        argv += f"{SPECIFIERS} {PIDFD_SPECIFIER}".split()
    pattern = "|" + " ".join(argv)
    assert len(pattern) <= 127, pattern
    lent.point(pattern, CORE_PIPE_LIMIT)
    hold, pid, trigger_ns = crash_once(tools, mib, half)
    ran, trace = tools.check(method, written, pid)
    if trace is not None:
        trace["trigger_realtime_ns"] = trigger_ns
    return hold, ran, trace


def live(tools: Tools, workloads, methods, runs: int, tiny_runs: int, states) -> dict:
    """{state: {"workloads": {workload: {method: [seconds]}}, ...}}, rounds interleaved. The core_pattern lock is
    taken per round, not for the whole run, so the other users' live tests are not locked out for an hour."""
    results = {}
    with systemd_coredump(tools.work) if SDCD in methods else contextlib.nullcontext() as sdcd:
        for state in states:
            if state == "busy":
                tools.fill_page_cache(page_cache_state()["ram_bytes"])
            res = results[state] = {"cache_before": page_cache_state(), "workloads": {}, "strategies": {},
                                    "traces": {}}
            if tiny_runs:
                tiny = res["workloads"]["tiny (1 MiB)"] = {m: [] for m in TINY_METHODS}
                with borrowed("bench/capture.py") as lent:
                    for run in range(tiny_runs):
                        for method in rotated(TINY_METHODS, run):
                            tiny[method].append(measure(tools, lent, method, 1, False, sdcd)[0])
                            tools.clean()
            for run in range(runs):
                with borrowed("bench/capture.py") as lent:
                    for label, mib, half in rotated(workloads, run):
                        samples = res["workloads"].setdefault(label, {m: [] for m in methods})
                        for method in rotated(methods, run):
                            hold, strategy, trace = measure(tools, lent, method, mib, half, sdcd)
                            samples[method].append(hold)
                            if strategy:
                                res["strategies"].setdefault(label, {}).setdefault(method, []).append(strategy)
                            if method == DEFAULT:  # one per round, in the rounds' order, beside the holds
                                res["traces"].setdefault(label, []).append(trace)
                            tools.clean()
                res.setdefault("round_loads", []).append(round(os.getloadavg()[0], 2))
                print(f"live {state} round {run + 1}/{runs} done, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
            res["cache_after"] = page_cache_state()
            res["sdcd_compressed"] = sdcd.compressed if sdcd else None
            if state == "busy":
                tools.drop_filler()
    return results


# ---- feeder ----

def feed_once(tools: Tools, method: str, mode: str, size: int, settings_path: Path) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSPLICE_")}
    argv = tools.handler_argv(method, str(tools.out / "core"))
    if method in CSPLICE:
        settings_path.write_text(csplice_settings(tools.spool, CSPLICE[method]))
        env["CSPLICE_SETTINGS"] = str(settings_path)
        # %c unlimited: RLIMIT_CORE 0 would keep no core (design.md, "RLIMIT_CORE")
        argv += [str(os.getpid()), "1", "1", "0", "0", "1", "11", str(int(time.time())), "18446744073709551615",
                 "bench", "bench"]
    proc = subprocess.run([str(tools.feeder), "--size", str(size), "--mode", mode, "--", *argv], env=env,
                          capture_output=True, text=True, check=True)
    stats = json.loads([line for line in proc.stderr.splitlines() if line.startswith("{")][-1])
    if stats["exit"] != 0 or stats["push_error"] != 0:
        raise SystemExit(f"{method} behind the feeder failed: {proc.stderr}")
    return stats["ns"] / 1e9


def feeder(tools: Tools, size: int, runs: int, methods) -> dict:
    results = {}
    for mode in ("write", "vmsplice"):
        samples = {m: [] for m in methods}
        for run in range(runs):
            for method in rotated(methods, run):
                samples[method].append(feed_once(tools, method, mode, size, tools.work / "csplice.conf"))
                tools.check(method, size, os.getpid())
                tools.clean()
        results[mode] = samples
        print(f"feeder {mode}: " + ", ".join(f"{m} {median(s) * 1e3:.0f} ms" for m, s in samples.items()),
              file=sys.stderr)
    return results


# ---- report ----

def feeder_table(samples: dict) -> str:
    rows = []
    for method, s in samples.items():
        rows.append([LABELS[method], median(s) * 1e3, spread(s), paired_ratio(s, samples[FLOOR]),
                     paired_ratio(s, samples[RW_LOOP])])
    return markdown_table(["handler", "median ms", "min–max ms", "× floor", "× read/write loop"], rows)


def ms(samples: list[float]) -> str:
    return f"{median(samples) * 1e3:.0f} ({spread(samples)})" if samples else "= default"


def physical_floor(samples: dict) -> list[float]:
    """Per round, the larger of the two floors measured in it: the kernel's drain and the disk's O_DIRECT write."""
    if ODIRECT not in samples:
        return samples[FLOOR]
    return [max(a, b) for a, b in zip(samples[FLOOR], samples[ODIRECT], strict=True)]


def why(label: str, ran: str, mib: int, half: bool, direct_above: int) -> str:
    """The default's strategy for a row and the reason csplice picked it: the process's VmRSS against the
    direct_above rendered from this host's measured write rates."""
    resident = mib // 2 if half else mib
    if not direct_above:
        return f"{ran} (direct_above off)"
    side = "≥" if resident * MiB >= direct_above else "<"
    return f"{ran} (~{resident} MiB resident {side} {direct_above // MiB} MiB)"


def ran_summary(ran: list[list]) -> str:
    """What the default ran over the rounds ([strategy, MiB moved to direct or None] each): "rw→direct at
    16–18 MiB ×4, rw ×1"."""
    if not ran:
        return "?"
    rounds: dict[str, list] = {}
    for strategy, at in ran:
        rounds.setdefault(strategy if at is None else f"{strategy}→direct", []).append(at)
    parts = []
    for name, where in rounds.items():
        at = [w for w in where if w is not None]
        span = "" if not at else f" at {min(at)} MiB" if min(at) == max(at) else f" at {min(at)}–{max(at)} MiB"
        parts.append(f"{name}{span} ×{len(where)}")
    return ", ".join(parts)


def live_table(res: dict, methods, workloads, direct_above: int) -> tuple[str, list[str]]:
    """The issue's table for one page-cache state, and the goals it misses, each with what the same round's
    experiments say of its cause: how far both floors at once are from the larger alone (the machine's own
    contention) and how much shorter than systemd-coredump a hold at the physical floor itself would be."""
    header = ["crash"] + [SHORT.get(m, m) + " ms (min–max)" for m in methods] + [
        "physical floor ms", "default × physical floor: p50", "p90", "worst round", "default × drain floor"]
    if BOTH in methods:
        header += ["both floors at once × physical floor", "default × both floors at once"]
    header += ["systemd-coredump ÷ default", "systemd-coredump ÷ physical floor", "default ran"]
    rows, misses = [], []
    shape = {label: (mib, half) for label, mib, half in workloads}
    for label, samples in res["workloads"].items():
        if label.startswith("tiny"):
            continue
        d = samples[DEFAULT]
        physical = physical_floor(samples)
        ratios = [a / b for a, b in zip(d, physical, strict=True)]
        x_physical, p90, worst = median(ratios), percentile(ratios, 0.9), max(ratios)
        x_floor = paired_ratio(d, samples[FLOOR])
        nan = float("nan")
        vs_sdcd = paired_ratio(samples[SDCD], d) if SDCD in samples else nan
        sdcd_ceiling = paired_ratio(samples[SDCD], physical) if SDCD in samples else nan
        ran = ran_summary(res["strategies"].get(label, {}).get(DEFAULT, []))
        row = [label] + [ms(samples[m]) for m in methods] + [ms(physical), x_physical, p90, worst, x_floor]
        contention = ""
        if BOTH in samples:
            both_x, over_both = paired_ratio(samples[BOTH], physical), paired_ratio(d, samples[BOTH])
            row += [both_x, over_both]
            contention = (f": both floors at once take {both_x:.2f}× the larger alone, and the default holds "
                          f"{over_both:.2f}× both at once")
        rows.append(row + [vs_sdcd, sdcd_ceiling, why(label, ran, *shape[label], direct_above)])
        if x_physical > 1.1:
            misses.append(f"{label}: hold {x_physical:.2f}× the physical floor (goal ≤ 1.1){contention}")
        if worst > 1.3:
            misses.append(f"{label}: worst round {worst:.2f}× the physical floor (goal ≤ 1.3)")
        if SDCD in samples and vs_sdcd < 8:
            misses.append(f"{label}: systemd-coredump holds {vs_sdcd:.1f}× as long (goal ≥ 8); a hold at the "
                          f"physical floor itself would be {sdcd_ceiling:.1f}× shorter")
    legend = "".join(f"- {SHORT.get(m, m)}: {LABELS[m]}\n" for m in methods)
    legend += ("- physical floor: per round the larger of the drain floor and the O_DIRECT floor; the ratios are "
               "per round: p50 (median), p90 and the worst.\n")
    return markdown_table(header, rows) + "\n" + legend + worst_rounds(res), misses


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile: the value that q of the rounds are at or below."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def breakdown(hold: float, trace: dict) -> str:
    """Where a hold's time went, in ms, by csplice's own trace (its record's capture.phases, ns after its start):
    the kernel's part before csplice ran (the trigger to csplice's start: the dump's set-up, the exec), each step
    of csplice's until the release, and the part after it (the kernel's tear-down until the reaping)."""
    ph = trace["phases"]
    start = (trace["started_realtime_ns"] - trace["trigger_realtime_ns"]) / 1e6
    parts, last = [f"before csplice {start:.1f}"], 0
    # In the order they happened: the ring is set up at the handoff, after the first byte, when rw moves.
    for name in sorted((n for n in PHASES if n != "published" and ph.get(n)), key=lambda n: ph[n]):
        parts.append(f"{name.replace('_', ' ')} +{(ph[name] - last) / 1e6:.1f}")
        last = ph[name]
    parts.append(f"after the release {hold * 1e3 - start - last / 1e6:.1f}")
    return (" → ".join(parts) + f"; longest read {trace['longest_read_ns'] / 1e6:.1f}, longest write "
            f"{trace['longest_write_ns'] / 1e6:.1f}")


def worst_rounds(res: dict) -> str:
    """The default's worst round per workload (by its ratio to the round's physical floor), broken down."""
    lines = []
    for label, samples in res["workloads"].items():
        traces = res.get("traces", {}).get(label, [])
        d = samples.get(DEFAULT, [])
        if label.startswith("tiny") or not d or len(traces) != len(d):
            continue
        physical = physical_floor(samples)
        by_ratio = sorted(range(len(d)), key=lambda i: d[i] / physical[i])
        worst, typical = by_ratio[-1], by_ratio[(len(by_ratio) - 1) // 2]
        if any(traces[i] is None or not traces[i].get("phases") for i in (worst, typical)):
            continue
        for what, i in (("worst", worst), ("median", typical)):
            lines.append(f"- {label}, {what}: round {i + 1}, {d[i] * 1e3:.0f} ms ({d[i] / physical[i]:.2f}× its "
                         f"floor of {physical[i] * 1e3:.0f} ms): {breakdown(d[i], traces[i])}")
    if not lines:
        return ""
    return ("\nThe default's worst round per crash beside its median one, by csplice's own trace of each (ms; "
            "each step's share, `capture.phases` of its record):\n" + "\n".join(lines) + "\n")


def tiny_table(samples: dict) -> str:
    d = samples[DEFAULT]
    over_nodump = median(a - b for a, b in zip(d, samples[NODUMP])) * 1e3
    over_floor = median(a - b for a, b in zip(d, samples[FLOOR])) * 1e3
    rows = [[LABELS[m], f"{median(samples[m]) * 1e3:.2f}", spread(samples[m])]
            for m in TINY_METHODS]
    return (markdown_table(["handler", "median ms", "min–max ms"], rows) +
            f"\ncsplice default over no dump: {over_nodump:.2f} ms, over the bare drain: {over_floor:.2f} ms "
            f"(medians of round-by-round differences; goal ≤ 1 ms over the bare drain).\n")


def plot(live_results: dict, methods, out: Path) -> None:
    panels = {}
    for state, res in live_results.items():
        for kind in ("dense", "half untouched"):
            series = {}
            for label, samples in res["workloads"].items():
                if label.startswith("tiny") or not label.endswith(kind):
                    continue
                mib = int(label.split()[0]) * (1024 if "GiB" in label else 1)
                for m in methods:
                    if samples[m]:
                        series.setdefault(m, {})[mib] = samples[m]
            panels[f"{kind}, {state} page cache"] = series
    plot_holds(out, "Hold of a crashed process per handler (bench/capture.py)", panels, LABELS)


NOTES = """\
## Reading the numbers
- Drain floor: the kernel writing the dump into a pipe enlarged to csplice's pipe size, drained by splice() to
  /dev/null: no file at all. O_DIRECT floor: the spool filesystem writing as many bytes with O_DIRECT from one
  buffer, no crash, in the same round; it is what the disk takes, whatever the page cache does.
- A handler that writes through the page cache needs a fresh page for every page of the dump; on these VMs
  (free page reporting returns freed memory to the host) a fresh page costs a round trip to the host, a
  recycled one does not, which is why the same buffered write varies 0.2-1.8 s per GiB. O_DIRECT from a few
  reused buffers costs the disk's rate instead, steadily.
- 2 CPUs and one virtual disk: single rounds vary by up to 2x even with nothing else running; read the
  medians, the spread and the paired ratios together.
"""


def report(live_results: dict, feeder_results: dict, args, tools: Tools) -> str:
    out = ["# Capture benchmark: how long each handler holds a crashed process\n",
           f"Generated by `bench/capture.py {' '.join(sys.argv[1:])}` on "
           f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC.",
           f"Machine: {machine()}. Spool and output files on {filesystem_of(tools.work)}. Load average "
           f"at the start: {args.load_before}, at the end: {os.getloadavg()[0]:.2f} (on 2 CPUs, above 1 means "
           f"something else ran too).",
           f"Medians of {args.runs} interleaved rounds (tiny process: {args.tiny_runs}, feeder: {args.feeder_runs}), "
           "min–max beside them; ratios are medians of round-by-round ratios.\n"]
    if args.rates is not None:
        out.append(f"Capture strategy chosen by measuring this host (host/writerates.py, as `corehandler install` "
                   f"and the daemon do), into the spool's filesystem at the start: {args.rates_reason}. csplice "
                   f"default ran with `{' '.join(f'{k}={v}' for k, v in CSPLICE[DEFAULT].items())}`.\n")
    if live_results:
        methods = args.method_list
        out.append(f"## Live kernel (core_pipe_limit {CORE_PIPE_LIMIT}): crash trigger to reaped\n")
        out.append(f"![hold against dump size]({args.out.with_suffix('.png').name})\n")
        for state, res in live_results.items():
            text, misses = live_table(res, methods, args.workloads, int(CSPLICE[DEFAULT]["direct_above"]))
            out += [f"### {state.capitalize()} page cache\n",
                    f"Before: {describe_cache(res['cache_before'])}. After: {describe_cache(res['cache_after'])}. "
                    f"Load after each round: {', '.join(map(str, res.get('round_loads', [])))}."
                    + ("" if res["sdcd_compressed"] in (None, True) else " systemd-coredump did NOT compress!")
                    + "\n", text]
            out.append("Goals missed: " + "; ".join(misses) + ".\n" if misses else "Every goal met.\n")
            tiny = res["workloads"].get("tiny (1 MiB)")
            if tiny:
                out += [f"#### Tiny crash (1 MiB), {state} page cache\n", tiny_table(tiny)]
    if feeder_results:
        out.append(f"## Feeder, {args.feeder_mib} MiB dense: first byte pushed to handler exit\n")
        for mode, samples in feeder_results.items():
            kernel = "stock kernel's path" if mode == "write" else "COREDUMP_USE_PIPE kernel's path"
            out += [f"### {mode}() ({kernel})\n", feeder_table(samples)]
    out.append(NOTES)
    return "\n".join(out)


def measure_rates_into(state_dir: Path) -> paths.Paths:
    """This host's write rates measured into a bench's own state dir, as install and the daemon measure them."""
    state = paths.Paths(state_dir=state_dir)
    state.spool_dir.mkdir(parents=True, exist_ok=True)
    writerates.save(state, writerates.measure(state))
    return state


def measure_write_rates(args) -> None:
    """The default's direct_above as install would render it here: measured into the bench's own state dir."""
    state = measure_rates_into(args.work / "state")
    measured = writerates.load(state)
    args.rates, args.rates_reason = writerates.describe(measured), writerates.choose(measured).reason
    CSPLICE[DEFAULT] = default_tuning(state)
    LABELS[DEFAULT] = default_label(CSPLICE[DEFAULT])
    CSPLICE.update(default_variants(CSPLICE[DEFAULT]))
    print(f"write rates: {args.rates_reason}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10, help="rounds per size and state (p90 needs 10)")
    parser.add_argument("--tiny-runs", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="before every change to csplice (under 10 minutes "
                        "on a quiet machine): 3 rounds of 64 MiB to 1 GiB on a quiet page cache, 9 tiny rounds, no "
                        "feeder; writes capture-quick.md unless --out says otherwise")
    parser.add_argument("--sizes", default="64,256,1024,4096", help="MiB, comma-separated")
    parser.add_argument("--methods", default=",".join(LIVE_METHODS),
                        help=f"live handlers, comma-separated; {FLOOR!r} and {DEFAULT!r} are always measured")
    parser.add_argument("--no-busy", action="store_true", help="skip the busy page cache")
    parser.add_argument("--busy-only", action="store_true", help="only the busy page cache (its own --out)")
    parser.add_argument("--no-live", action="store_true")
    parser.add_argument("--no-feeder", action="store_true")
    parser.add_argument("--feeder-mib", type=int, default=256)
    parser.add_argument("--feeder-runs", type=int, default=11)
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/corehandler-bench"))
    parser.add_argument("--out", type=Path, default=None, help="default bench/results/capture.md, with --quick "
                        "capture-quick.md")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.tiny_runs, args.feeder_runs = 3, 9, 5
        args.sizes, args.no_busy, args.no_feeder = "64,256,1024", True, True
    args.out = args.out or HERE / "results" / ("capture-quick.md" if args.quick else "capture.md")

    tools = Tools(args.work)
    measure_write_rates(args)
    args.load_before = f"{os.getloadavg()[0]:.2f}"
    asked = args.methods.split(",")
    unknown = [m for m in asked if m not in LABELS]
    if unknown:
        parser.error(f"unknown --methods {', '.join(unknown)}: one of {', '.join(LABELS)}")
    # The floor and the default always run: every ratio is against them.
    args.method_list = [m for m in LIVE_METHODS if m in asked or m in (FLOOR, DEFAULT)] + \
        [m for m in asked if m not in LIVE_METHODS]
    workloads = []
    for mib in (int(s) for s in args.sizes.split(",")):
        for half in (False, True):
            name = f"{mib // 1024} GiB" if mib >= 1024 else f"{mib} MiB"
            workloads.append((f"{name}, {'half untouched' if half else 'dense'}", mib, half))
    args.workloads = workloads
    states = ("busy",) if args.busy_only else ("quiet",) if args.no_busy else ("quiet", "busy")
    try:
        live_results = {} if args.no_live else live(tools, workloads, args.method_list, args.runs, args.tiny_runs,
                                                    states)
        feeder_results = {} if args.no_feeder else feeder(tools, args.feeder_mib * MiB, args.feeder_runs,
                                                          FEEDER_METHODS)
    finally:
        tools.clean()
        tools.drop_filler()
    text = report(live_results, feeder_results, args, tools)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    if live_results:
        plot(live_results, args.method_list, args.out.with_suffix(".png"))
    raw = args.out.parent / "raw" / (args.out.stem + ".json")
    raw.parent.mkdir(exist_ok=True)
    raw.write_text(json.dumps({"live": live_results, "feeder": feeder_results, "args": vars(args)}, indent=1,
                              default=str))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
