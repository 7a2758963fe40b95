"""Build and run tests/support/crasher.c: real processes that crash with a known memory pattern."""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("crasher.c")
PATTERN = 0xC0FFEE00C0FFEE00


def build_crasher(cache_dir: Path, static: bool = False) -> Path:
    """Compiles the crasher once per source version into cache_dir and returns its path."""
    digest = hashlib.sha256(SOURCE.read_bytes() + (b"static" if static else b"")).hexdigest()[:12]
    binary = cache_dir / f"crasher-{digest}"
    if not binary.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        cmd = ["gcc", "-O1", "-g", "-pthread", "-o", str(binary) + ".tmp", str(SOURCE)]
        if static:
            cmd.insert(1, "-static")
        subprocess.run(cmd, check=True)
        os.replace(str(binary) + ".tmp", binary)
    return binary


def _allow_core():
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def crash(binary: Path, kind: str = "segv", mib: int = 1, untouched_half: bool = False, untouched: bool = False,
          timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs the crasher to its death with core dumps allowed; returncode is minus the signal."""
    args = [str(binary), kind, str(mib)] + (["--untouched-half"] if untouched_half else []) + \
        (["--untouched"] if untouched else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, preexec_fn=_allow_core)


def python_crash(timeout: float = 60) -> subprocess.CompletedProcess:
    """A Python interpreter that dies of SIGSEGV (as a buggy C extension would make it)."""
    code = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    return subprocess.run(["python3", "-c", code], capture_output=True, timeout=timeout, preexec_fn=_allow_core)
