"""The kernel matrix's host side: which kernel images, the guest's initramfs, and one qemu boot.

The guest (tests/kernel/init.sh as PID 1, tests/kernel/guest.c for the work) runs a plan of crash cases and
prints one `RESULT {json}` line per check on the serial console; boot() returns them parsed. Used by
tests/kernel/test_kernels.py and bench/kernel.py (which put tests/ and tests/kernel/ on sys.path).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from corehandler.csplice_contract import PIDFD_SPECIFIER, SPECIFIERS
from support import cbuild
from support.crash import build_crasher

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FLAVOURS = ("stock", "patched")
BUILD_SCRIPT = HERE / "build-kernels.sh"
QEMU = "qemu-system-x86_64"
APPEND = "console=ttyS0 panic=-1 tsc=reliable"
BUSYBOX = Path("/bin/busybox")


class MatrixError(Exception):
    """The matrix cannot run here; the message says what to install or build."""


def cache_dir() -> Path:
    """Where build-kernels.sh puts its kernels and this module its guest binaries (the script's default)."""
    value = os.environ.get("COREHANDLER_KERNEL_CACHE")
    if value:
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "corehandler" / "kernel"


def kernel_dir(environ: dict[str, str] | None = None) -> Path:
    """COREHANDLER_KERNEL_DIR (relative to the repository root, e.g. ../shared/kernel) or the build cache."""
    value = (os.environ if environ is None else environ).get("COREHANDLER_KERNEL_DIR")
    if not value:
        return cache_dir()
    path = Path(value)
    return (path if path.is_absolute() else REPO / path).resolve()


def kernel_images(directory: Path) -> dict[str, Path]:
    images = {flavour: directory / f"bzImage-{flavour}" for flavour in FLAVOURS}
    missing = [str(path) for path in images.values() if not path.is_file()]
    if missing:
        raise MatrixError(f"no kernel image {', '.join(missing)}: run {BUILD_SCRIPT.relative_to(REPO)} "
                          "or set COREHANDLER_KERNEL_DIR (e.g. ../shared/kernel)")
    return images


def _digest(*parts: bytes) -> str:
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:12]


def _is_static(binary: Path) -> bool:
    """No PT_INTERP program header: the guest has no dynamic loader."""
    data = binary.read_bytes()
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return all(struct.unpack_from("<I", data, phoff + i * phentsize)[0] != 3 for i in range(phnum))


def _require_static(binary: Path) -> Path:
    if not _is_static(binary):
        raise MatrixError(f"{binary} is not statically linked")
    return binary


def _run(cmd: list[str]) -> None:
    try:
        cbuild.run(cmd)
    except cbuild.BuildError as e:
        raise MatrixError(str(e)) from None


def build_csplice_static(cache: Path) -> Path:
    """The project's csplice, configured with -DCSPLICE_STATIC=ON, once per source version."""
    try:
        binary = cbuild.build_target("csplice", cache, "-DCSPLICE_STATIC=ON")
    except cbuild.BuildError as e:
        raise MatrixError(str(e)) from None
    return _require_static(binary)


def build_guest(cache: Path) -> Path:
    source = HERE / "guest.c"
    # The guest's core_pattern takes csplice's argv from the control plane's one copy of it, %F included as
    # install and the boot-time sysctl.d file set it on every kernel (6.1 passes csplice nothing for it).
    argv = f"{SPECIFIERS} {PIDFD_SPECIFIER}"
    binary = cache / f"guest-{_digest(source.read_bytes(), argv.encode())}"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        _run(["gcc", "-static", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", f'-DSPECIFIERS="{argv}"',
              "-o", f"{binary}.tmp", str(source)])
        os.replace(f"{binary}.tmp", binary)
    return _require_static(binary)


@dataclasses.dataclass(frozen=True)
class Case:
    """One crash in the guest: see `guest case` in guest.c for the fields."""

    name: str
    kind: str = "segv"  # segv: one thread; abort: five threads, abort() from a worker
    mib: int = 16
    untouched_half: bool = False
    handler: str = "csplice"  # csplice | csplice-timed | sink-splice | sink-read (+batch, +pin: see guest.c)
    verify: bool = True
    strategy: str = "rw"
    chunk_size: int = 65536
    pipe_size: int = 0

    def line(self) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name):
            raise ValueError(f"case name {self.name!r}: letters, digits, '_.-' only")
        return " ".join([self.name, self.handler, self.kind, str(self.mib), str(int(self.untouched_half)),
                         str(int(self.verify)), self.strategy, str(self.chunk_size), str(self.pipe_size)])


def _cpio_entry(name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0), ino: int = 0) -> bytes:
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
    header = b"070701" + b"".join(b"%08x" % f for f in fields) + name.encode() + b"\0"
    header += b"\0" * (-len(header) % 4)
    return header + data + b"\0" * (-len(data) % 4)


def _cpio(entries: list[tuple[str, int, bytes, tuple[int, int]]]) -> bytes:
    out = [_cpio_entry(name, mode, data, rdev, ino) for ino, (name, mode, data, rdev) in enumerate(entries, 1)]
    return b"".join(out) + _cpio_entry("TRAILER!!!", 0)


def build_initramfs(cases: list[Case], out: Path) -> Path:
    """An uncompressed newc initramfs: busybox, csplice, the crasher, the guest helper, /init and the plan."""
    if not BUSYBOX.is_file() or not _is_static(BUSYBOX):
        raise MatrixError(f"{BUSYBOX} is missing or not static: apt-get install busybox-static")
    cache = cache_dir()
    plan = "".join(case.line() + "\n" for case in cases)
    directory, executable, plain = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o755, stat.S_IFREG | 0o644
    entries = [(d, directory, b"", (0, 0)) for d in
               ("bin", "dev", "proc", "sys", "run", "spool", "tmp", "var", "var/lib", "var/lib/corehandler")]
    # The kernel opens /dev/console for init before init can mount devtmpfs.
    entries.append(("dev/console", stat.S_IFCHR | 0o600, b"", (5, 1)))
    entries += [
        ("init", executable, (HERE / "init.sh").read_bytes(), (0, 0)),
        ("bin/busybox", executable, BUSYBOX.read_bytes(), (0, 0)),
        ("bin/guest", executable, build_guest(cache).read_bytes(), (0, 0)),
        ("csplice", executable, build_csplice_static(cache).read_bytes(), (0, 0)),
        ("crasher", executable, _require_static(build_crasher(cache, static=True)).read_bytes(), (0, 0)),
        ("plan", plain, plan.encode(), (0, 0)),
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(_cpio(entries))
    return out


@dataclasses.dataclass
class Boot:
    kernel: Path
    smp: int
    results: list[dict]
    console: str
    seconds: float
    timed_out: bool

    def case(self, name: str) -> dict:
        found = [r for r in self.results if r.get("case") == name]
        if not found:
            raise KeyError(f"no RESULT for {name!r} from {self.kernel.name}; console tail:\n{self.console[-3000:]}")
        return found[0]

    @property
    def finished(self) -> bool:
        return any(r.get("case") == "done" for r in self.results)


RESULT = re.compile(r"RESULT (\{.*\})\s*$")


def parse_results(console: str) -> list[dict]:
    results = []
    for line in console.splitlines():
        match = RESULT.search(line)
        if match:
            try:
                results.append(json.loads(match.group(1)))
            except json.JSONDecodeError:
                results.append({"case": "garbled", "ok": False, "line": line})
    return results


def boot(kernel: Path, initrd: Path, smp: int = 2, memory_mib: int = 4096, timeout: float = 540,
         extra_args: Sequence[str] = (), on_line: Callable[[str], None] | None = None) -> Boot:
    """Boots kernel + initrd under TCG (KVM does not boot guests on these machines) until the guest powers off.

    on_line sees each console line as it arrives (a profiler follows the guest's `BEGIN case` lines with it).
    """
    if not shutil.which(QEMU):
        raise MatrixError(f"{QEMU} is missing: apt-get install qemu-system-x86")
    cmd = [QEMU, "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", str(smp), "-m", str(memory_mib),
           "-nographic", "-no-reboot", "-kernel", str(kernel), "-initrd", str(initrd), "-append", APPEND,
           *extra_args]
    started = time.monotonic()
    lines: list[str] = []
    with subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as qemu:
        watchdog = threading.Timer(timeout, qemu.kill)
        watchdog.start()
        try:
            for raw in qemu.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\r\n").replace("\r", "")
                lines.append(line)
                if on_line:
                    on_line(line)
            qemu.wait()
        finally:
            watchdog.cancel()
            if qemu.poll() is None:
                qemu.kill()
    console = "\n".join(lines)
    timed_out = time.monotonic() - started >= timeout
    return Boot(kernel, smp, parse_results(console), console, time.monotonic() - started, timed_out)
