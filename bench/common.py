"""What every benchmark in bench/ shares: medians and paired ratios, the markdown table, the machine's
description, and exclusive use of the host's core_pattern (the lock tests/conftest.py takes too)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import statistics
import subprocess
from pathlib import Path

CORE_PATTERN_LOCK = Path("/run/lock/corehandler-core-pattern.lock")
SYSCTLS = ("kernel/core_pattern", "kernel/core_pipe_limit")


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


@contextlib.contextmanager
def host_core_settings(settings_file: Path):
    """Exclusive use of kernel.core_pattern, core_pipe_limit and csplice's fixed settings file; everything is
    put back as it was on any exit, as tests/conftest.py's fixture of the same name does."""
    CORE_PATTERN_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(CORE_PATTERN_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = {name: Path("/proc/sys", name).read_text() for name in SYSCTLS}
        made_dir = not settings_file.parent.exists()
        saved_settings = settings_file.read_bytes() if settings_file.exists() else None
        try:
            settings_file.parent.mkdir(parents=True, exist_ok=True)
            yield saved
        finally:
            for name, value in saved.items():
                Path("/proc/sys", name).write_text(value)
            if saved_settings is not None:
                settings_file.write_bytes(saved_settings)
            else:
                settings_file.unlink(missing_ok=True)
                if made_dir:
                    with contextlib.suppress(OSError):
                        settings_file.parent.rmdir()
