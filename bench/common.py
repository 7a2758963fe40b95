"""What every benchmark in bench/ shares: medians and paired ratios, the markdown table, the machine's
description, csplice.conf for a tuning. Exclusive use of the host's core_pattern and csplice.conf is
tests/support/host_core.py's borrow (host/handler.py, the one writer), shared with the tests."""

from __future__ import annotations

import functools
import os
import platform
import statistics
import subprocess
from pathlib import Path

from corehandler import paths
from corehandler.config import CaptureConfig
from corehandler.csplice_contract import Facts, parse_settings, render_settings


def median(values) -> float:
    return statistics.median(values)


def paired_ratio(samples: list[float], baseline: list[float]) -> float:
    """Median of run-by-run ratios: run i of a method against run i of the baseline, measured side by side,
    so that load from other users of the machine cancels out."""
    return statistics.median(s / b for s, b in zip(samples, baseline, strict=True))


def markdown_table(header: list[str], rows: list[list]) -> str:
    def cell(v):
        if isinstance(v, float):
            return f"{v:.2f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


@functools.cache
def csplice_builtin() -> Facts:
    """What csplice uses for strategy, direct_above and direct_rate when csplice.conf leaves them out (`csplice
    --list-settings`): a tuning that names none of them runs on these, as on csplice's built-ins."""
    listed = subprocess.run([str(paths.csplice_path()), "--list-settings"], capture_output=True, text=True,
                            check=True).stdout
    values = parse_settings(listed)
    return Facts(values["strategy"], int(values["direct_above"]), int(values["direct_rate"]))


def csplice_settings(spool: Path, **tuning) -> str:
    """csplice.conf writing into spool with tuning's keys (the one renderer, csplice_contract.render_settings);
    every key the tuning leaves out at csplice's built-in default (the config's defaults are csplice's,
    csplice_builtin() the rest), so csplice runs as on the tuning's keys alone."""
    return render_settings(CaptureConfig(), spool, csplice_builtin(),
                           overrides=tuning)


def publish(out: Path, text: str) -> None:
    """A benchmark's result: written to out (under bench/results/) and printed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs, {mem_kib / 2**20:.0f} GiB RAM, Linux {platform.release()}"


def filesystem_of(path: Path) -> str:
    out = subprocess.run(["df", "--output=fstype,source", str(path)], capture_output=True, text=True).stdout
    return " ".join(out.splitlines()[-1].split()) if out else "?"


def spread(values) -> str:
    """min–max, the spread a reader needs beside a median on a shared machine."""
    return f"{min(values) * 1e3:.0f}–{max(values) * 1e3:.0f}"


def page_cache_state() -> dict:
    """The page cache's share of memory now (bytes), from /proc/meminfo, and the load average."""
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        info[key] = int(value.split()[0]) * 1024
    return {"ram_bytes": info["MemTotal"], "cached_bytes": info["Cached"], "dirty_bytes": info["Dirty"],
            "free_bytes": info["MemFree"], "load": os.getloadavg()[0]}


def describe_cache(state: dict) -> str:
    g = 1 << 30
    return (f"page cache {state['cached_bytes'] / g:.1f} GiB ({state['dirty_bytes'] / g:.2f} GiB dirty), "
            f"{state['free_bytes'] / g:.1f} GiB free of {state['ram_bytes'] / g:.0f} GiB, load {state['load']:.2f}")


def plot_holds(path: Path, title: str, panels: dict, labels: dict) -> None:
    """One panel per entry of panels ({panel title: {method: {size_mib: [seconds]}}}): median hold against dump
    size per handler, min-max as error bars, both axes logarithmic. Written as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.8 * rows), squeeze=False)
    for ax, (panel, series) in zip(axes.flat, panels.items()):
        for method, by_size in series.items():
            sizes = sorted(by_size)
            meds = [median(by_size[s]) for s in sizes]
            lo = [m - min(by_size[s]) for m, s in zip(meds, sizes)]
            hi = [max(by_size[s]) - m for m, s in zip(meds, sizes)]
            ax.errorbar(sizes, meds, yerr=[lo, hi], marker="o", capsize=3,
                        label=labels.get(method, method).replace("*", ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({s for by_size in series.values() for s in by_size})
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_xlabel("dump size (MiB)")
        ax.set_ylabel("hold (s): crash to reaped")
        ax.set_title(panel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
