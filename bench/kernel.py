#!/usr/bin/env python3
"""Stock vs COREDUMP_USE_PIPE kernels under qemu: the patch mail's "Before / After / Improved by" table
for csplice, and the -smp 2 collapse investigation. Writes bench/results/kernel.md.

    python3 bench/kernel.py [--reps N] [--sizes 256,1024] [--full] [--out FILE] [--raw FILE]

Images: COREHANDLER_KERNEL_DIR (relative to the repository root, e.g. ../shared/kernel) or the cache of
tests/kernel/build-kernels.sh (whose System.map files let the profiler name kernel functions). Every boot runs
one kernel; boots alternate between the kernels (stock, patched, patched, stock, ...) so drifting host load
hits both alike. In the guest, each case crashes a process of the given size with the clock started at the
crash: hold = crash to reaped (core_pipe_limit makes the kernel wait for the handler), dumper CPU = the
crashed process's CPU time during the dump (wait4 rusage minus /proc/PID/stat before), handler CPU = the
handler's rusage (a wrapper forks it). The guest's core_pattern is its own (the host's is never touched).
Default run: 12-20 minutes on the shared 2-core host (a -smp 2 boot takes up to 3 minutes when its dumps
collapse); --full doubles the repetitions and adds -smp 1 to the investigation. A run rewrites the tables and
keeps the hand-written "## Findings" section at the end of the output file.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "kernel"), str(REPO / "bench")]

import kernel_matrix as km  # noqa: E402
from common import markdown_table  # noqa: E402
from kernel_matrix import Case  # noqa: E402
from kernel_profile import Profiler  # noqa: E402

MIB = 1 << 20
BOOT_TIMEOUT = 420
# A collapsed run: slow, with both vCPUs busy the whole time (dumper + handler CPU well above the hold).
# Healthy runs here move 0.09-1.7 GB/s; collapsed ones 0.01-0.07 GB/s at 180-200% CPU.
COLLAPSED_GBPS = 0.1
COLLAPSED_CPU = 1.5


def collapsed_run(r: dict) -> bool:
    size = r["core_bytes"] or r["sink_bytes"]
    cpu = (r["dumper_cpu_ns"] + max(r["handler_cpu_ns"], 0)) / r["hold_ns"]
    return size / r["hold_ns"] < COLLAPSED_GBPS and cpu > COLLAPSED_CPU


def table_cases(sizes: list[int]) -> list[Case]:
    cases = []
    for mib in sizes:
        # The patch mail's handler, the 16-page splice loop (splice() stdin to disk 64 KiB at a time): here
        # csplice's splice strategy, to tmpfs.
        cases.append(Case(f"csplice-splice-tmpfs-{mib}", handler="csplice-timed", mib=mib, verify=False,
                          strategy="splice"))
        cases.append(Case(f"csplice-rw-tmpfs-{mib}", handler="csplice-timed", mib=mib, verify=False, strategy="rw"))
        cases.append(Case(f"splice-devnull-{mib}", handler="sink-splice", mib=mib, verify=False))
    return cases


def investigation_cases(mib: int) -> list[Case]:
    def sink(name, handler, **kw):
        return Case(f"{name}-{mib}", handler=handler, mib=mib, verify=False, **kw)

    def csplice(strategy, **kw):
        suffix = "-1m" if kw else ""
        return Case(f"csplice-{strategy}{suffix}-{mib}", handler="csplice-timed", mib=mib, verify=False,
                    strategy=strategy, **kw)

    return [
        sink("null-splice", "sink-splice"),
        sink("null-read", "sink-read"),
        sink("null-splice-1m", "sink-splice", chunk_size=MIB, pipe_size=MIB),
        sink("null-splice-batch-1m", "sink-splice+batch", chunk_size=MIB, pipe_size=MIB),
        sink("null-splice-pin", "sink-splice+pin"),
        csplice("rw"), csplice("splice"), csplice("rw2"), csplice("splice2"),
        csplice("splice", chunk_size=MIB, pipe_size=MIB), csplice("splice2", chunk_size=MIB, pipe_size=MIB),
    ]


def run_boots(images, cases, smp, reps, tmp: Path, profile: bool, log) -> tuple[list[dict], dict]:
    """reps boots per kernel, alternating; returns one row per case result and the profiles per kernel."""
    initrd = km.build_initramfs(cases, tmp / f"initramfs-{abs(hash(tuple(cases)))}.cpio")
    rows, profiles = [], {flavour: {} for flavour in km.FLAVOURS}
    for rep in range(reps):
        order = km.FLAVOURS if rep % 2 == 0 else tuple(reversed(km.FLAVOURS))
        for flavour in order:
            profiler = None
            if profile:
                socket_path = tmp / f"monitor-{flavour}-{rep}.sock"
                profiler = Profiler(socket_path, images[flavour].with_name(f"System.map-{flavour}"))
                profiler.start()
            boot = km.boot(images[flavour], initrd, smp=smp, timeout=BOOT_TIMEOUT,
                           extra_args=profiler.monitor_args() if profiler else (),
                           on_line=profiler.follow if profiler else None)
            if profiler:
                profiler.stop()
                for case, counter in profiler.samples.items():
                    profiles[flavour].setdefault(case, collections.Counter()).update(counter)
            probe = next((r for r in boot.results if r.get("case") == "probe"), {})
            if probe.get("patched") != (flavour == "patched"):
                raise SystemExit(f"{images[flavour]} is not the {flavour} kernel (probe: {probe})")
            got = {r["case"]: r for r in boot.results if "hold_ns" in r}
            for case in cases:
                result = got.get(case.name, {"ok": False, "error": "no result (boot timed out)"})
                rows.append({"flavour": flavour, "smp": smp, "rep": rep, "case": case.name,
                             "host_load": os.getloadavg()[0], **result})
            print(f"  {flavour:7} smp={smp} rep={rep} {boot.seconds:5.1f}s "
                  f"{'TIMEOUT ' if boot.timed_out else ''}ok={sum(1 for c in cases if got.get(c.name, {}).get('ok'))}"
                  f"/{len(cases)} load={os.getloadavg()[0]:.1f}", file=log, flush=True)
    return rows, profiles


def summarise(rows: list[dict], case: str, flavour: str, smp: int) -> dict | None:
    ok = [r for r in rows if r["case"] == case and r["flavour"] == flavour and r["smp"] == smp and r["ok"]]
    failed = sum(1 for r in rows if r["case"] == case and r["flavour"] == flavour and r["smp"] == smp and not r["ok"])
    if not ok:
        return None
    hold = [r["hold_ns"] / 1e9 for r in ok]
    size = statistics.median((r["core_bytes"] or r["sink_bytes"]) for r in ok)
    dumper = statistics.median(r["dumper_cpu_ns"] / 1e9 for r in ok)
    handler = statistics.median(r["handler_cpu_ns"] / 1e9 for r in ok)
    collapsed = sum(1 for r in ok if collapsed_run(r))
    return {"n": len(ok), "failed": failed, "collapsed": collapsed,
            "hold": statistics.median(hold), "min": min(hold), "max": max(hold),
            "gbps": size / statistics.median(hold) / 1e9, "dumper": dumper, "handler": handler,
            "cpu": (dumper + handler) / statistics.median(hold) * 100}


def improved(before: float, after: float, lower_is_better: bool = True) -> str:
    if not before:
        return "n/a"
    change = (before - after) / before if lower_is_better else (after - before) / before
    return f"{change * 100:+.1f}%"


def table(header: list[str], rows: list[list]) -> list[str]:
    return markdown_table(header, rows).splitlines() + [""]


def patch_mail_table(rows, case, smp) -> list[str]:
    s, p = summarise(rows, case, "stock", smp), summarise(rows, case, "patched", smp)
    if not s or not p:
        return [f"_{case} at -smp {smp}: no successful run on both kernels_", ""]
    return table(["", "Before (stock)", "After (patched)", "Improved by"], [
        ["Time to completion (hold, median)", f"{s['hold']:.2f} s", f"{p['hold']:.2f} s",
         improved(s["hold"], p["hold"])],
        ["Throughput", f"{s['gbps']:.3f} GB/s", f"{p['gbps']:.3f} GB/s",
         improved(s["gbps"], p["gbps"], lower_is_better=False)],
        ["CPU usage ((dumper + handler CPU) / hold)", f"{s['cpu']:.1f}%", f"{p['cpu']:.1f}%",
         improved(s["cpu"], p["cpu"])],
        ["Dumper CPU", f"{s['dumper']:.2f} s", f"{p['dumper']:.2f} s", improved(s["dumper"], p["dumper"])],
        ["Handler CPU", f"{s['handler']:.2f} s", f"{p['handler']:.2f} s", improved(s["handler"], p["handler"])],
    ])


def ratio_table(rows, cases, smp) -> list[str]:
    def hold(x):
        return f"{x['hold']:.2f} s ({x['min']:.2f}-{x['max']:.2f})" if x else "failed"

    def col(x, key, fmt):
        return fmt.format(x[key]) if x else "-"

    def runs(x):
        return f"{x['n']}/{x['n'] + x['failed']}" if x else "0"

    body = []
    for case in cases:
        s, p = summarise(rows, case.name, "stock", smp), summarise(rows, case.name, "patched", smp)
        body.append([
            case.name, hold(s), hold(p), f"{p['hold'] / s['hold']:.2f}" if s and p else "-",
            col(s, "gbps", "{:.3f}"), col(p, "gbps", "{:.3f}"),
            f"{s['dumper']:.2f}+{s['handler']:.2f} s" if s else "-",
            f"{p['dumper']:.2f}+{p['handler']:.2f} s" if p else "-",
            f"{runs(s)} s, {runs(p)} p", f"{col(s, 'collapsed', '{}')} s, {col(p, 'collapsed', '{}')} p",
        ])
    return table(["case", "stock hold (min-max)", "patched hold (min-max)", "patched/stock hold", "stock GB/s",
                  "patched GB/s", "stock CPU d+h", "patched CPU d+h", "runs ok s/p", "collapsed s/p"], body)


def profile_table(profiles, cases) -> list[str]:
    body = []
    for case in cases:
        for flavour in km.FLAVOURS:
            counter = profiles.get(flavour, {}).get(case.name)
            if not counter:
                continue
            total = sum(counter.values())
            top = ", ".join(f"{name} {count / total:.0%}" for name, count in counter.most_common(5))
            body.append([case.name, flavour, f"{top} ({total} samples)"])
    return table(["case", "kernel", "where the vCPUs were (share of samples)"], body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3,
                        help="boots per kernel for the table at -smp 1 (default 3; -smp 2 gets one fewer)")
    parser.add_argument("--sizes", default="256,1024", help="MiB, comma-separated (default 256,1024)")
    parser.add_argument("--investigate-mib", type=int, default=256)
    parser.add_argument("--full", action="store_true", help="twice the repetitions, and -smp 1 investigated too")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "kernel.md")
    parser.add_argument("--raw", type=Path, help="also write every result as JSON here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    reps = args.reps * (2 if args.full else 1)
    inv_reps = 4 if args.full else 2
    try:
        images = km.kernel_images(km.kernel_dir())
    except km.MatrixError as e:
        print(f"bench/kernel.py: {e}", file=sys.stderr)
        return 1
    started = datetime.datetime.now(datetime.timezone.utc)
    table = table_cases(sizes)
    inv = investigation_cases(args.investigate_mib)
    rows: list[dict] = []
    profiles: dict = {}
    with tempfile.TemporaryDirectory(prefix="corehandler-kernel-bench-") as tmp:
        # -smp 2 boots take up to 3 minutes each when dumps collapse: fewer of them keeps the default ~15 min.
        for smp, n in ((1, reps), (2, max(1, reps - 1))):
            print(f"table, -smp {smp}: {n} boots per kernel", file=sys.stderr)
            rows += run_boots(images, table, smp, n, Path(tmp), profile=False, log=sys.stderr)[0]
        for smp in ((2, 1) if args.full else (2,)):
            print(f"investigation, -smp {smp}: {inv_reps} boots per kernel, profiled", file=sys.stderr)
            inv_rows, inv_profiles = run_boots(images, inv, smp, inv_reps, Path(tmp), profile=True, log=sys.stderr)
            rows += [dict(r, investigation=True) for r in inv_rows]
            if smp == 2:
                profiles = inv_profiles
    minutes = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds() / 60
    if args.raw:
        args.raw.write_text(json.dumps({"rows": rows, "profiles": profiles}, indent=1))
    headline = f"csplice-splice-tmpfs-{max(sizes)}"
    table_rows = [r for r in rows if not r.get("investigation")]
    inv_rows = [r for r in rows if r.get("investigation")]
    md = [
        "# Kernel matrix: stock vs COREDUMP_USE_PIPE (the vmsplice patch), csplice under qemu",
        "",
        f"Tables generated by `python3 bench/kernel.py{' --full' if args.full else ''}` "
        f"on {started:%Y-%m-%d %H:%M} UTC "
        f"in {minutes:.0f} min; kernels from `{km.kernel_dir()}`; medians over boots per kernel (`runs ok` "
        "says how many), boots alternating between the kernels. Host load average during the run: "
        f"{min(r['host_load'] for r in rows):.1f}-{max(r['host_load'] for r in rows):.1f} on 2 cores.",
        "",
        "**TCG caveat.** The guest runs under qemu TCG (KVM does not boot here), on a 2-core host shared with "
        "other work. TCG slows memory copies and, far more, cross-vCPU interrupts, so absolute times and GB/s "
        "say nothing about real hardware; compare the kernels by their ratios, measured in the same run. "
        "CPU times are the guest's tick-based accounting.",
        "",
        f"## The patch mail's table: {headline} (csplice, splice strategy, 64 KiB chunks, into tmpfs)",
        "",
        "The patch's v3 mail: 40.77 s -> 35.49 s (12.95%), CPU 92.27% -> 86.40% (6.36%), 32 GB on real hardware.",
        "",
        "-smp 1 (no cross-CPU wakeups; the cleanest comparison; one vCPU is always busy, so CPU usage is ~100% "
        "by construction and the CPU seconds are what differ):",
        "",
        *patch_mail_table(table_rows, headline, 1),
        "-smp 2 (the matrix's standard command line; see the investigation for why it is noisy):",
        "",
        *patch_mail_table(table_rows, headline, 2),
        "## Every case, both kernels",
        "",
        "tmpfs cases: csplice into a spool on tmpfs (record committed and complete, size checked). devnull "
        "cases: a reference reader that splice()s the pipe to /dev/null, 64 KiB at a time (csplice itself "
        "always writes a file; this isolates the kernel side). CPU d+h: dumper + handler CPU seconds (medians). "
        f"collapsed: runs below {COLLAPSED_GBPS} GB/s with dumper + handler CPU above {COLLAPSED_CPU:.0%} of the "
        "hold (both vCPUs busy, neither getting anywhere).",
        "",
        "-smp 1:",
        "",
        *ratio_table(table_rows, table, 1),
        "-smp 2:",
        "",
        *ratio_table(table_rows, table, 2),
        f"## The -smp 2 collapse: investigation ({args.investigate_mib} MiB, {inv_reps} boots per kernel)",
        "",
        *ratio_table(inv_rows, inv, 2),
        *(["-smp 1:", "", *ratio_table(inv_rows, inv, 1)] if args.full else []),
        "Where the vCPUs were during each dump (the qemu monitor's RIP of every vCPU, 20 times a second, named "
        "with the kernel's System.map; idle = amd_e400_idle/default_idle):",
        "",
        *profile_table(profiles, inv),
        kept_findings(args.out),
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(md) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


FINDINGS = "## Findings"


def kept_findings(out: Path) -> str:
    """The findings are written by people, from this and earlier runs: a new run keeps them and says so."""
    old = out.read_text() if out.exists() else ""
    if FINDINGS not in old:
        return f"{FINDINGS}\n\n(none written yet)\n"
    kept = old[old.index(FINDINGS):].rstrip("\n")
    return kept + "\n"


if __name__ == "__main__":
    sys.exit(main())
