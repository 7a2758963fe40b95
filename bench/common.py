"""What every benchmark in bench/ shares: medians and paired ratios, the markdown table, the machine's
description. Exclusive use of the host's core_pattern is tests/support/host_core.py's, shared with the tests."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from pathlib import Path


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


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return f"{platform.node()}: {cpu}, {os.cpu_count()} CPUs, {mem_kib / 2**20:.0f} GiB RAM, Linux {platform.release()}"


def filesystem_of(path: Path) -> str:
    out = subprocess.run(["df", "--output=fstype,source", str(path)], capture_output=True, text=True).stdout
    return " ".join(out.splitlines()[-1].split()) if out else "?"
