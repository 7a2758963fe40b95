"""How long does each core_pattern handler hold a crashed process?

Live kernel (root; takes the core_pattern lock, restores everything): real processes of 256 MiB and 1 GiB
(4 GiB with --full), dense and half untouched, crash with core_pipe_limit 16; the clock runs from the crash
trigger to the parent reaping the process (os.wait4), i.e. the whole time the kernel holds it. Also a tiny
process, for the per-crash overhead. Handlers: csplice with each strategy and tuning, `cat > file`, a plain
read()/write() loop and splice() to /dev/null (no file: the kernel's own dump rate, the floor).

Feeder (no root): the same handlers behind the feeder's write() path (a stock kernel) and vmsplice() path
(a COREDUMP_USE_PIPE kernel); the clock runs from the first byte pushed to the handler's exit.

Medians of --runs runs, handlers interleaved within each run (a different order per run), ratios paired run by
run against splice->/dev/null of the same run. Writes bench/results/capture.md.

    python -P bench/capture.py [--runs 7] [--full] [--no-live] [--no-feeder]
"""

from __future__ import annotations

import argparse
import datetime
import json
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

from common import filesystem_of, machine, markdown_table, median, paired_ratio  # noqa: E402

from corehandler import paths  # noqa: E402
from corehandler.install import PIDFD_SPECIFIER, SPECIFIERS  # noqa: E402
from support import cbuild  # noqa: E402
from support.crash import build_crasher  # noqa: E402
from support.host_core import host_core_settings  # noqa: E402
from support.waiting import wait_for  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
CORE_PIPE_LIMIT = "16"
FLOOR = "null"
RW_LOOP = "loop"

# csplice as it can be configured: strategy, bytes per system call, core pipe size (0 = the kernel's 64 KiB).
CSPLICE = {
    "rw": {"strategy": "rw", "chunk_size": 64 * 1024, "pipe_size": 0},
    "rw-256K-1M": {"strategy": "rw", "chunk_size": 256 * 1024, "pipe_size": MiB},
    "rw-1M": {"strategy": "rw", "chunk_size": MiB, "pipe_size": MiB},
    "splice": {"strategy": "splice", "chunk_size": 64 * 1024, "pipe_size": 0},
    "rw2-1M": {"strategy": "rw2", "chunk_size": MiB, "pipe_size": MiB},
    "splice2-256K-1M": {"strategy": "splice2", "chunk_size": 256 * 1024, "pipe_size": MiB},
}
BASELINES = ("cat", RW_LOOP, FLOOR)
LABELS = {
    "rw": "csplice rw, 64K chunk, kernel's 64K pipe",
    "rw-256K-1M": "**csplice rw, 256K chunk, 1M pipe (default, stock kernel)**",
    "rw-1M": "csplice rw, 1M chunk, 1M pipe",
    "splice": "csplice splice (the 16-page splice loop)",
    "rw2-1M": "csplice rw2 (2 threads, 4x1M ring), 1M pipe",
    "splice2-256K-1M": "**csplice splice2 (2-stage splice), 1M pipes (default, COREDUMP_USE_PIPE kernel)**",
    "cat": "`cat > file`",
    RW_LOOP: "plain read/write loop, 64K",
    FLOOR: "splice -> /dev/null (floor)",
}
METHODS = tuple(CSPLICE) + BASELINES


def csplice_settings(spool: Path, tuning: dict) -> str:
    # Limits off: a benchmark is a crash storm by design.
    lines = {"spool_dir": spool, "max_pending": 0, "max_per_exe_per_minute": 0, "min_free": 0,
             "sparse": "yes", **tuning}
    return "".join(f"{k}={v}\n" for k, v in lines.items())


class Tools:
    """The programs a benchmark runs, built once under work."""

    def __init__(self, work: Path):
        self.work = work
        self.bin = work / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.crasher = build_crasher(self.bin)
        self.baselines = self.bin / "baselines"
        subprocess.run(["gcc", "-O2", "-o", str(self.baselines), str(HERE / "baselines.c")], check=True)
        self.cat = self.bin / "cat-to-file"
        self.cat.write_text('#!/bin/sh\nexec cat > "$1"\n')
        self.cat.chmod(0o755)
        self.csplice = paths.csplice_path()
        self.feeder = cbuild.feeder()
        self.spool = work / "spool"
        self.out = work / "out"
        self.out.mkdir(exist_ok=True)

    def handler_argv(self, method: str, target: str) -> list[str]:
        """The handler's command line; target names the output file (the kernel expands %P in it)."""
        if method in CSPLICE:
            return [str(self.csplice)]
        if method == "cat":
            return [str(self.cat), target]
        if method == RW_LOOP:
            return [str(self.baselines), "rw", target]
        return [str(self.baselines), "null"]

    def clean(self) -> None:
        # Delete each core at once: its dirty pages are dropped instead of written back under the next run.
        for d in (self.spool, self.out):
            shutil.rmtree(d, ignore_errors=True)
        self.out.mkdir()

    def check(self, method: str, size: int) -> None:
        """The handler really captured the dump (a benchmark of a failing handler measures nothing)."""
        if method in CSPLICE:
            records = wait_for(lambda: list(self.spool.glob("*.json")), 30, f"{method}'s record", interval=0.002)
            cap = json.loads(records[0].read_text())["capture"]
            if not cap["complete"] or cap["bytes"] < size:
                raise SystemExit(f"{method}: capture incomplete: {cap}")
        elif method != FLOOR:
            files = list(self.out.iterdir())
            if not files or files[0].stat().st_size < size:
                raise SystemExit(f"{method}: core missing or short: {files}")


def rotated(methods, run: int) -> list:
    k = run % len(methods)
    return list(methods[k:]) + list(methods[:k])


# ---- live kernel ----

def allow_core():
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def crash_once(tools: Tools, mib: int, half: bool) -> float:
    """Seconds from the crash trigger to the reaping of the crashed process."""
    argv = [str(tools.crasher), "segv", str(mib), "--wait"] + (["--untouched-half"] if half else [])
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=allow_core)
    proc.stdout.readline()  # memory filled, waiting for the go
    t0 = time.perf_counter()
    proc.stdin.write(b"\n")
    proc.stdin.flush()
    _, status, _ = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    proc.returncode = -1  # reaped above; keep Popen from waiting again
    proc.stdin.close()
    proc.stdout.close()
    if not os.WIFSIGNALED(status) or os.WTERMSIG(status) != 11:
        raise SystemExit(f"crasher did not die of SIGSEGV: status {status:#x}")
    return elapsed


def live(tools: Tools, workloads, methods) -> dict:
    results = {}
    conf = paths.CSPLICE_SETTINGS
    with host_core_settings(conf):
        Path("/proc/sys/kernel/core_pipe_limit").write_text(CORE_PIPE_LIMIT)
        for label, mib, half, n in workloads:
            samples = {m: [] for m in methods}
            for run in range(n):
                for method in rotated(methods, run):
                    argv = tools.handler_argv(method, str(tools.out / "core.%P"))
                    if method in CSPLICE:
                        conf.write_text(csplice_settings(tools.spool, CSPLICE[method]))
                        argv += f"{SPECIFIERS} {PIDFD_SPECIFIER}".split()
                    pattern = "|" + " ".join(argv)
                    assert len(pattern) <= 127, pattern
                    Path("/proc/sys/kernel/core_pattern").write_text(pattern)
                    samples[method].append(crash_once(tools, mib, half))
                    tools.check(method, mib * MiB // 2 if half else mib * MiB)
                    tools.clean()
            results[label] = samples
            print(f"live {label}: " + ", ".join(f"{m} {median(s) * 1e3:.0f} ms" for m, s in samples.items()),
                  file=sys.stderr)
    return results


# ---- feeder ----

def feed_once(tools: Tools, method: str, mode: str, size: int, settings_path: Path) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSPLICE_")}
    argv = tools.handler_argv(method, str(tools.out / "core"))
    if method in CSPLICE:
        settings_path.write_text(csplice_settings(tools.spool, CSPLICE[method]))
        env["CSPLICE_SETTINGS"] = str(settings_path)
        argv += [str(os.getpid()), "1", "1", "0", "0", "1", "11", str(int(time.time())), "0", "bench", "bench"]
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
                tools.check(method, size)
                tools.clean()
        results[mode] = samples
        print(f"feeder {mode}: " + ", ".join(f"{m} {median(s) * 1e3:.0f} ms" for m, s in samples.items()),
              file=sys.stderr)
    return results


# ---- report ----

def table(samples: dict) -> str:
    rows = []
    for method, s in samples.items():
        rows.append([LABELS[method], median(s) * 1e3, paired_ratio(s, samples[FLOOR]),
                     paired_ratio(s, samples[RW_LOOP])])
    return markdown_table(["handler", "median ms", "× floor", "× read/write loop"], rows)


def best_csplice(samples: dict) -> tuple[str, float]:
    return min(((m, paired_ratio(samples[m], samples[RW_LOOP])) for m in CSPLICE if m in samples),
               key=lambda x: x[1])


STOCK_DEFAULT = "rw-256K-1M"
PATCHED_DEFAULT = "splice2-256K-1M"
NOTES = """\
## Reading the numbers
- The floor is splice to /dev/null on the kernel's 64K pipe. Handlers that enlarge the pipe can hold a process
  for less than that (the kernel then blocks less often on a full pipe), hence ratios below 1 on half-untouched
  dumps, where the kernel streams zero pages fast.
- The machine is shared (2 CPUs, other engineers' builds and qemu guests): single runs vary by up to 2x, so only
  the paired ratios of many interleaved runs mean something, and only differences of more than ~10%.
- rw2 is erratic on 2 CPUs: a reader, a writer and the kernel's dump writer compete for two cores, and whether
  the reader wakes for every page the kernel writes depends on where the scheduler puts it.
"""


def verdict(samples_by_workload: dict, method: str) -> str:
    """The default against the read/write loop in every workload of this table: the target is <= 1."""
    ratios = {w: paired_ratio(s[method], s[RW_LOOP]) for w, s in samples_by_workload.items() if method in s}
    if not ratios:
        return ""
    cells = ", ".join(f"{w} {r:.2f}" for w, r in ratios.items())
    return f"{LABELS[method].strip('*')} × read/write loop: {cells}; worst {max(ratios.values()):.2f}.\n"


def report(live_results: dict, feeder_results: dict, args, tools: Tools) -> str:
    out = ["# Capture benchmark: how long each handler holds a crashed process\n",
           f"Generated by `bench/capture.py` on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC.",
           f"Machine: {machine()}. Spool and output files on {filesystem_of(tools.work)}. Load average "
           f"(other users of the machine) at the start: {args.load_before}, at the end: {os.getloadavg()[0]:.2f}.",
           f"Medians of {args.runs} interleaved runs (tiny process: {args.tiny_runs}, feeder: {args.feeder_runs}); "
           "ratios are medians of "
           f"run-by-run ratios against the same run's {LABELS[FLOOR]} and {LABELS[RW_LOOP]}.\n"]
    if live_results:
        out.append(f"## Live kernel (core_pipe_limit {CORE_PIPE_LIMIT}): crash trigger to reaped\n")
        for label, samples in live_results.items():
            best, ratio = best_csplice(samples)
            out += [f"### {label}\n", table(samples), f"Fastest csplice: {LABELS[best]} ({ratio:.2f}× the read/write loop).\n"]
        big = {w: s for w, s in live_results.items() if not w.startswith("tiny")}
        out.append(verdict(big, STOCK_DEFAULT))
    if feeder_results:
        out.append(f"## Feeder, {args.feeder_mib} MiB dense: first byte pushed to handler exit\n")
        for mode, samples in feeder_results.items():
            best, ratio = best_csplice(samples)
            kernel = "stock kernel's path" if mode == "write" else "COREDUMP_USE_PIPE kernel's path"
            out += [f"### {mode}() ({kernel})\n", table(samples), f"Fastest csplice: {LABELS[best]} ({ratio:.2f}× the read/write loop).\n"]
        out.append(verdict({"write": feeder_results["write"]}, STOCK_DEFAULT))
        out.append(verdict({"vmsplice": feeder_results["vmsplice"]}, PATCHED_DEFAULT))
    out.append(NOTES)
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--tiny-runs", type=int, default=15)
    parser.add_argument("--full", action="store_true", help="also crash 4 GiB processes")
    parser.add_argument("--sizes", default="256,1024", help="MiB, comma-separated (--full adds 4096)")
    parser.add_argument("--no-tiny", action="store_true")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma-separated subset; {FLOOR!r} and {RW_LOOP!r} are always measured")
    parser.add_argument("--no-live", action="store_true")
    parser.add_argument("--no-feeder", action="store_true")
    parser.add_argument("--feeder-mib", type=int, default=256)
    parser.add_argument("--feeder-runs", type=int, default=15)
    parser.add_argument("--work", type=Path, default=Path("/tmp/corehandler-bench"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "capture.md")
    args = parser.parse_args()

    tools = Tools(args.work)
    args.load_before = f"{os.getloadavg()[0]:.2f}"
    methods = [m for m in METHODS if m in args.methods.split(",") or m in (RW_LOOP, FLOOR)]
    workloads = [] if args.no_tiny else [("tiny (1 MiB)", 1, False, args.tiny_runs)]
    sizes = [int(s) for s in args.sizes.split(",")] + ([4096] if args.full else [])
    for mib in sizes:
        for half in (False, True):
            name = f"{mib // 1024} GiB" if mib >= 1024 else f"{mib} MiB"
            workloads.append((f"{name}, {'half untouched' if half else 'dense'}", mib, half, args.runs))
    try:
        live_results = {} if args.no_live else live(tools, workloads, methods)
        feeder_results = {} if args.no_feeder else feeder(tools, args.feeder_mib * MiB, args.feeder_runs, methods)
    finally:
        tools.clean()
    text = report(live_results, feeder_results, args, tools)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    raw = args.out.parent / "raw" / (args.out.stem + ".json")
    raw.parent.mkdir(exist_ok=True)
    raw.write_text(json.dumps({"live": live_results, "feeder": feeder_results, "args": vars(args)}, indent=1,
                              default=str))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
