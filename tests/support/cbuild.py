"""The project's C programs that no package ships, built by CMake for the tests and benchmarks: the feeder
(test-only: it plays the kernel's side of the pipe) and the kernel tier's static csplice. Each build goes into
its own directory under a cache, named for the sources it was built from, so an edit means a new build and
an unchanged tree none."""

from __future__ import annotations

import atexit
import functools
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class BuildError(Exception):
    """CMake failed; the message holds the end of its output."""


def _sources_digest(*extra: str) -> str:
    files = sorted(p for p in (REPO / "csplice").iterdir() if p.is_file())
    files += [REPO / "CMakeLists.txt", REPO / "pyproject.toml"]
    h = hashlib.sha256("\0".join(extra).encode())
    for path in files:
        h.update(b"\0" + path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed:\n{(done.stdout + done.stderr)[-2000:]}")


def build_target(target: str, cache: Path, *defines: str) -> Path:
    """csplice/<target> built from this tree with the given -D options into cache (once per source version)."""
    build = cache / f"{target}-{_sources_digest(target, *defines)}"
    binary = build / "csplice" / target
    if not binary.exists():
        run(["cmake", "-S", str(REPO), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", *defines])
        run(["cmake", "--build", str(build), "--target", target, "-j2"])
    return binary


@functools.cache
def feeder() -> Path:
    """The feeder, built once per process into a private directory that goes when the process does."""
    cache = Path(tempfile.mkdtemp(prefix="corehandler-feeder-"))
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    return build_target("feeder", cache)
