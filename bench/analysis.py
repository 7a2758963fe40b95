"""What does crash analysis (corehandler/analysis/unwind.py) cost, and what does it add to crash -> indexed?

Cores: real crashes of tests/support/analysed.c (a tiny crash; 1, 64 and 500 threads) and of
tests/support/crasher.c with a 256 MiB and a 1 GiB region written, cored by gdb's gcore (no core_pattern
change, nothing global). Per core and round, rounds interleaved:
  analysis       unwind.analyse() alone (eu-stack + eu-unstrip -n in their sandbox, parsing, keys);
  gdb            `gdb -batch -ex "thread apply all bt 64"`, the alternative unwinder, same core;
  compress       what ingest does without analysis: compress.store_file (zstd level 3) + verify;
  ingest         the same with the analysis started before compression and collected after it, as
                 ingest.Ingest runs them: added = ingest / compress - 1 is what analysis adds to the daemon's
                 part of crash -> indexed (capture and csplice are untouched by it);
  mini core      analysis/minicore.write() from the raw core (default caps): its time, its size (per thread),
                 and its share of ingest (mini / compress), which it adds to crash -> indexed.
Medians and min-max over --rounds; the machine's load and page cache go into the table.

Symbols from debuginfod (analysis/debuginfod.py), a second table: a stripped build of analysed.c whose debug
file a real `debuginfod` serves on the loopback of a network namespace of its own (tests/support/
debuginfod_server.py), crashed in segv; per round, cold (the cache emptied: the fetch, then the analysis
reading the fetched file), warm (the file cached: the fetch finds it, the analysis reads it) and without
symbols (no cache in the path), all with the analyser jailed as the daemon runs it; SYMBOLS_ROUNDS of these
per round of the rest, their order turning.

Python frames (analysis/pyframes.py), a third table: a CPython process that fills a heap of --python-mib MiB
and then segfaults through ctypes three calls deep, cored by gcore; per core and round, the unwinder alone
(unwind.analyse, as above) and pystack reading the Python frames in the same jail (pyframes.read), the order
turning round by round. --native-only / --python-only run one part (a smoke run: `--python-only --python-mib 16
--rounds 1 --out /tmp/x.md`).

    python -P bench/analysis.py [--rounds 3] [--big-mib 256,1024] [--python-mib 64,256,1024,4096]
                                [--out bench/results/analysis.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from common import machine, markdown_table, median, publish  # noqa: E402

from corehandler.analysis import debuginfod, findings, minicore, pyframes, unwind  # noqa: E402
from corehandler.store import compress  # noqa: E402
from support import debuginfod_server, pycrash, realcore  # noqa: E402
from support.crash import build_crasher  # noqa: E402


def make_cores(tmp: Path, big: list[int]) -> list[tuple[str, realcore.Crash]]:
    binary = realcore.build(tmp, name="analysed")
    cores = [("tiny (segv, 1 thread)", realcore.crash(binary, tmp / "core.tiny", "segv"))]
    for n in (64, 500):
        cores.append((f"{n} threads", realcore.crash(binary, tmp / f"core.t{n}", "threads", str(n - 1))))
    crasher = build_crasher(tmp)
    for mib in big:
        cores.append((f"{mib} MiB", realcore.crash(crasher, tmp / f"core.{mib}", "segv", str(mib), timeout=600)))
    return cores


def timed(fn) -> float:
    started = time.monotonic()
    fn()
    return time.monotonic() - started


def ingest(core: Path, store: Path, record: dict | None) -> None:
    running = unwind.start(core, record) if record is not None else None
    stored = compress.store_file(core, store, "bench", enabled=True, level=3, threads=0)
    compress.verify(stored.path, stored.raw_bytes, stored.sha256)
    if running is not None:
        unwind.finish(running)
    stored.path.unlink()


def gdb_bt(c: realcore.Crash) -> None:
    subprocess.run(["gdb", "-q", "-nx", "-batch", "-ex", "thread apply all bt 64", str(c.binary), str(c.core)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def state() -> str:
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    mem = {line.split(":")[0]: int(line.split()[1]) for line in open("/proc/meminfo")}
    return (f"load average {load}; page cache {mem['Cached'] / 2**20:.1f} GiB, free {mem['MemFree'] / 2**20:.1f} "
            f"GiB of {mem['MemTotal'] / 2**20:.1f} GiB")


def spread(values: list[float], scale: float = 1000.0) -> str:
    return f"{median(values) * scale:.0f} ({min(values) * scale:.0f}-{max(values) * scale:.0f})"


SYMBOLS_ROUNDS = 4  # per round of the rest: each of these takes a tenth of a second


def symbols_inside(core: str, record: str, state: str, build_id: str, rounds: str) -> None:
    """Run beside the server in its namespace: prints the seconds of each kind per round, as JSON."""
    settings, cache = debuginfod.Settings(urls=(debuginfod_server.url(),)), debuginfod.cache_dir(Path(state))
    limits = debuginfod.reading_cache(findings.Limits(), Path(state))
    rec = json.loads(Path(record).read_text())
    out: dict[str, list[float]] = {"cold": [], "cold fetch": [], "warm": [], "without symbols": []}

    def symbolised() -> str | None:
        result = unwind.analyse(Path(core), rec, limits)
        return result["threads"][0]["frames"][0]["function"]
    def cold() -> None:
        shutil.rmtree(cache, ignore_errors=True)
        started = time.monotonic()
        fetched = debuginfod.fetch(settings, cache, [build_id]).fetched
        out["cold fetch"].append(time.monotonic() - started)
        assert fetched == [build_id] and symbolised() == "crash_segv", "cold: not symbolised"
        out["cold"].append(time.monotonic() - started)

    def warm() -> None:
        started = time.monotonic()
        assert not debuginfod.fetch(settings, cache, [build_id]).fetched and symbolised() == "crash_segv"
        out["warm"].append(time.monotonic() - started)

    def without() -> None:
        out["without symbols"].append(timed(lambda: unwind.analyse(Path(core), rec, findings.Limits())))
    for i in range(int(rounds)):  # warm after a cold one; which goes first turns round by round
        for step in ((cold, warm, without), (without, cold, warm))[i % 2]:
            step()
    print(json.dumps(out))


def symbols_table(tmp: Path, rounds: int) -> str:
    disk, served, build_id = debuginfod_server.stripped_with_debug_file(tmp / "symbols")
    c = realcore.crash(disk, tmp / "core.symbols", "segv")
    record = tmp / "symbols.json"
    record.write_text(json.dumps(realcore.record_for(c, "bench")))
    (run,) = debuginfod_server.in_netns(served, build_id, [[sys.executable, "-P", __file__, "--symbols-inside",
                                                            str(c.core), str(record), str(tmp / "state"), build_id,
                                                            str(rounds * SYMBOLS_ROUNDS)]])
    assert run["rc"] == 0, run["stderr"]
    times = json.loads(run["stdout"])
    rows = [[kind, spread(values), f"{median(values) / median(times['without symbols']):.2f}x"]
            for kind, values in times.items()]
    return markdown_table(["symbolisation (stripped segv, debug file "
                           f"{(served / 'analysed.debug').stat().st_size // 1024} KiB)", "ms", "/ without symbols"],
                          rows)


def python_table(tmp: Path, sizes: list[int], rounds: int) -> str:
    """pystack against eu-stack on CPython cores of each heap size: both in the analysis jail, as the daemon
    runs them one after the other in one worker."""
    interpreter = Path(sys.executable).resolve()
    script = pycrash.write(tmp / "crash.py", interpreter)
    cores = [(mib, realcore.crash(interpreter, tmp / f"core.py{mib}", str(script), "--heap", str(mib), timeout=1800))
             for mib in sizes]
    samples = {mib: {"eu-stack": [], "pystack": []} for mib in sizes}
    outcome: dict[int, dict] = {}
    for round_ in range(rounds):
        for mib, c in cores:
            record = realcore.record_for(c, "bench", exe=str(interpreter))
            analysed = unwind.analyse(c.core, record)
            for kind in (("eu-stack", "pystack") if round_ % 2 == 0 else ("pystack", "eu-stack")):
                if kind == "eu-stack":
                    samples[mib][kind].append(timed(lambda: unwind.analyse(c.core, record)))
                else:
                    samples[mib][kind].append(timed(lambda: outcome.__setitem__(
                        mib, pyframes.read(c.core, record, analysed))))
    rows = []
    for mib, c in cores:
        s, py = samples[mib], outcome[mib]
        frames = len((py["threads"] or [{}])[0].get("frames") or [])
        rows.append([str(mib), f"{c.core.stat().st_size / 2**20:.0f}", py["state"] + (
            f" ({py['problems'][0][:60]})" if py["problems"] else ""), str(frames), spread(s["eu-stack"]),
            spread(s["pystack"]), f"{median(s['pystack']) / median(s['eu-stack']):.1f}x"])
    return markdown_table(["heap MiB", "core MiB", "pystack state", "Python frames", "eu-stack ms",
                           "pystack ms", "pystack / eu-stack"], rows)


def main() -> int:
    if sys.argv[1:2] == ["--symbols-inside"]:
        symbols_inside(*sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big-mib", default="256,1024")
    ap.add_argument("--python-mib", default="64,256,1024,4096")
    ap.add_argument("--python-only", action="store_true", help="the Python frames' table alone")
    ap.add_argument("--native-only", action="store_true", help="every table but the Python frames'")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "analysis.md")
    args = ap.parse_args()
    big = [int(x) for x in args.big_mib.split(",") if x] if not args.python_only else []
    python_sizes = [int(x) for x in args.python_mib.split(",") if x] if not args.native_only else []
    before = state()
    with tempfile.TemporaryDirectory(prefix="bench-analysis-", dir="/var/tmp") as tmpdir:
        tmp = Path(tmpdir)
        store = tmp / "store"
        store.mkdir()
        python = python_table(tmp, python_sizes, args.rounds) if python_sizes else ""
        cores = make_cores(tmp, big) if not args.python_only else []
        kinds = ("analysis", "gdb", "compress", "ingest", "mini")
        samples: dict[str, dict[str, list[float]]] = {name: {k: [] for k in kinds} for name, _ in cores}
        results: dict[str, dict] = {}
        minis: dict[str, minicore.MiniCore] = {}
        for round_ in range(args.rounds):
            for name, c in cores:
                record = realcore.record_for(c, "bench")
                s = samples[name]
                s["analysis"].append(timed(lambda: results.__setitem__(name, unwind.analyse(c.core, record))))
                s["gdb"].append(timed(lambda: gdb_bt(c)))
                s["mini"].append(timed(lambda: minis.__setitem__(name, minicore.write(c.core, tmp / "mini"))))
                # without/with alternate who goes first, so neither always meets the other's page cache
                order = ("compress", "ingest") if round_ % 2 == 0 else ("ingest", "compress")
                for kind in order:
                    s[kind].append(timed(lambda: ingest(c.core, store, record if kind == "ingest" else None)))
        symbols = symbols_table(tmp, args.rounds) if not args.python_only else ""
        after = state()
        rows = []
        for name, c in cores:
            s, r = samples[name], results[name]
            added = [i / p - 1 for i, p in zip(s["ingest"], s["compress"])]
            share = [a / p for a, p in zip(s["analysis"], s["compress"])]
            rows.append([name, f"{c.core.stat().st_size / 2**20:.0f}", r["state"], str(r["threads_seen"]),
                         spread(s["analysis"]), spread(s["gdb"]), f"{median(s['gdb']) / median(s['analysis']):.1f}x",
                         spread(s["compress"]), f"{median(share) * 100:.0f}%", spread(s["ingest"]),
                         f"{median(added) * 100:+.0f}% ({min(added) * 100:+.0f}..{max(added) * 100:+.0f}%)",
                         f"{minis[name].bytes / 1024:.0f} ({minis[name].bytes / 1024 / max(1, minis[name].threads):.0f}"
                         f"/thread)", spread(s["mini"], 1e3),
                         f"{median([m / p for m, p in zip(s['mini'], s['compress'])]) * 100:.1f}%"])
    table = markdown_table(["core", "MiB", "analysis state", "threads", "analysis ms", "gdb bt ms",
                            "gdb / eu-stack", "ingest without ms", "analysis / ingest", "ingest with ms",
                            "added by analysis", "mini core KiB", "mini core ms", "mini / ingest"], rows)
    text = (f"# Crash analysis: cost per core and share of ingest\n\n"
            f"`python -P bench/analysis.py --rounds {args.rounds} --big-mib {args.big_mib}`, "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC.\n\n"
            f"Machine: {machine()}. Shared with other jobs during the run: before {before}; after {after}.\n"
            f"Cores by gdb's gcore, in page cache. Times: median (min-max) of {args.rounds} interleaved rounds.\n"
            f"\"ingest\" = zstd level 3 + verify (what the daemon does between validation and the index row), "
            f"without and with the analysis running beside it (alternating which runs first); \"analysis / ingest\" "
            f"= what it would add if run before compression instead of beside it; \"added\" = with / without - 1, "
            f"per round: what it does add. Single-round spreads this wide are the other jobs' disk and CPU use "
            f"(ingest fsyncs).\n\n"
            + table + "\n"
            f"Symbols from a local debuginfod (cold: cache emptied, fetch + analysis; warm: cached; \"cold fetch\": "
            f"the fetch alone), median (min-max) of {args.rounds * SYMBOLS_ROUNDS} rounds, the order turning "
            f"round by round:\n\n" + symbols + "\n"
            f"Python frames: pystack (in the analysis jail, after the unwinder, in the same worker) against the "
            f"unwinder on CPython cores of a heap of each size, median (min-max) of {args.rounds} rounds, the order "
            f"turning:\n\n" + python + "\n")
    publish(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
