"""What the running kernel offers a dump handler, found by reading and measuring, never by its version number
(`corehandler doctor`).

Each finding is a dict: {name, value, how ("read" | "measured" | "probed" | "not probed"), detail}. Everything
but probe_crash() only reads and measures: no setting of the host changes. probe_crash() crashes a throw-away
process through a temporary core_pattern (under the host-wide core_pattern lock, restored on every exit path) to
see what the kernel really hands a pipe handler: whether %F arrives as a pidfd of the crashed process, and
whether the dump's pages are copies (stock) or references to the process's own pages (COREDUMP_USE_PIPE).

The probe handler is this module itself, run by the kernel:
    python -P -m corehandler.host.kernelprobe handler RESULT_FILE %P %F
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import mmap
import os
import resource
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

from corehandler.errors import NotRootError, SystemFailure
from corehandler.host import handler, install, sysctl
from corehandler.paths import Host

MiB = 1 << 20
PMD_SIZE = 2 * MiB
# Below this ratio of splice to read() rate, /dev/zero's splice copies like read() does; with the zero page it
# moves page references and runs several times faster (about 8x where the zero-page splice patch is applied).
ZERO_PAGE_SPLICE_RATIO = 3.0
# The probe's shared page: the lowest mapping of the crashing process, so the kernel dumps it first and it sits
# in the (64 KiB) pipe when the kernel blocks.
PROBE_ADDR = 0x200000
PROBE_NAME = "corehandler-probe"
COREDUMP_FILTER_BITS = ("anonymous private", "anonymous shared", "file-backed private", "file-backed shared",
                        "ELF headers", "private huge pages", "shared huge pages", "private DAX", "shared DAX")


def finding(name: str, value, how: str, detail: str = "") -> dict:
    return {"name": name, "value": value, "how": how, "detail": detail}


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


# --- read ----------------------------------------------------------------------------------------------------

def core_modes(sysctl_root: Path = sysctl.SYSCTL_ROOT) -> dict:
    """kernel.core_modes (6.17+) lists the core_pattern kinds the kernel parses: file, pipe, socket."""
    try:
        modes = (sysctl_root / "kernel/core_modes").read_text().split()
    except OSError:
        return finding("core_modes", None, "read", "no kernel.core_modes: pipe mode only (every kernel since "
                       "2.6.19 has it); socket mode (@@) unknown, a kernel without core_modes predates it")
    return finding("core_modes", modes, "read", "pipe: |handler; socket: @@/path, the handler may refuse a dump "
                   "before it is written" if "socket" in modes else "no socket mode")


def core_pipe_limit(sysctl_root: Path = sysctl.SYSCTL_ROOT) -> dict:
    value = int(sysctl.read(sysctl.CORE_PIPE_LIMIT, sysctl_root))
    return finding("core_pipe_limit", value, "read",
                   "0: the kernel does not wait for pipe handlers, /proc/PID may be gone before they read it"
                   if value == 0 else f"up to {value} pipe handlers at once keep their crashed process in /proc")


def coredump_filter(proc_root: Path = Path("/proc")) -> dict:
    """The mask new processes inherit (this one's): which mappings a dump holds."""
    mask = int((proc_root / "self/coredump_filter").read_text(), 16)
    kept = [name for bit, name in enumerate(COREDUMP_FILTER_BITS) if mask >> bit & 1]
    return finding("coredump_filter", f"{mask:#x}", "read", "dumps " + ", ".join(kept))


def thp_mode(sys_root: Path = Path("/sys")) -> dict:
    try:
        text = (sys_root / "kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return finding("thp", None, "read", "no transparent huge pages in this kernel")
    mode = text[text.index("[") + 1:text.index("]")] if "[" in text else text.strip()
    return finding("thp", mode, "read", "transparent_hugepage/enabled")


# --- measured --------------------------------------------------------------------------------------------------

def _rate(move, total: int) -> float:
    t0 = time.perf_counter()
    done = 0
    while done < total:
        done += move()
    return done / (time.perf_counter() - t0)


def zero_splice_rate(total: int = 1 << 30, chunk: int = MiB) -> dict:
    """splice() /dev/zero -> pipe -> /dev/null against read() of /dev/zero into a buffer, both `chunk` a call.
    A kernel that splices the zero page (seed 000) moves references, several times faster than read()'s
    zeroing; one that copies (copy_splice_read) runs at about read()'s rate."""
    zero = os.open("/dev/zero", os.O_RDONLY | os.O_CLOEXEC)
    null = os.open("/dev/null", os.O_WRONLY | os.O_CLOEXEC)
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, chunk)

        def spliced():
            n = os.splice(zero, w, chunk)
            left = n
            while left:
                left -= os.splice(r, null, left)
            return n

        buf = bytearray(chunk)
        splice_bps = max(_rate(spliced, total) for _ in range(3))
        read_bps = max(_rate(lambda: os.readv(zero, [buf]), total // 4) for _ in range(3))
    finally:
        for fd in (zero, null, r, w):
            os.close(fd)
    ratio = splice_bps / read_bps
    return finding("zero_page_splice", ratio >= ZERO_PAGE_SPLICE_RATIO, "measured",
                   f"splice /dev/zero {splice_bps / 1e9:.1f} GB/s, read() {read_bps / 1e9:.1f} GB/s "
                   f"({ratio:.1f}x; {ZERO_PAGE_SPLICE_RATIO:.0f}x or more means the zero page is spliced)") | {
        "splice_bytes_per_second": splice_bps, "read_bytes_per_second": read_bps}


def _anon_huge_kib(addr: int, proc_root: Path = Path("/proc")) -> int:
    """AnonHugePages of the mapping starting at addr, from this process's smaps."""
    inside = False
    for line in (proc_root / "self/smaps").read_text().splitlines():
        first = line.split()[0] if line else ""
        if "-" in first and ":" not in first:
            inside = int(first.split("-")[0], 16) == addr
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def zero_mapping_alignment(mappings: int = 8, length: int = 4 * MiB) -> dict:
    """mmap(/dev/zero, MAP_PRIVATE) of more than 2 MiB, `mappings` times: how many start PMD-aligned (seed 003
    makes them all aligned under THP; by chance one in 512 is), and whether a touched, MADV_HUGEPAGE'd one gets
    huge pages. A one-page anonymous mapping between them keeps a top-down allocator from stacking aligned
    4 MiB mappings on one another by chance."""
    libc = _libc()
    fd = os.open("/dev/zero", os.O_RDWR | os.O_CLOEXEC)
    addrs, spacers = [], []
    huge_kib = 0
    failed = ctypes.c_void_p(-1).value
    try:
        for _ in range(mappings):
            addr = libc.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
            if addr in (None, failed):
                raise SystemFailure(f"mmap of /dev/zero failed: {os.strerror(ctypes.get_errno())}")
            addrs.append(addr)
            spacer = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
            if spacer not in (None, failed):
                spacers.append(spacer)
        first = addrs[0]
        libc.madvise(first, length, 14)  # MADV_HUGEPAGE, ignoring its result: refused where THP is off
        ctypes.memset(first, 1, length)
        huge_kib = _anon_huge_kib(first)
    finally:
        for addr in addrs:
            libc.munmap(addr, length)
        for spacer in spacers:
            libc.munmap(spacer, 4096)
        os.close(fd)
    aligned = sum(1 for a in addrs if a % PMD_SIZE == 0)
    return finding("zero_mapping_pmd_aligned", aligned == len(addrs), "measured",
                   f"{aligned} of {len(addrs)} private /dev/zero mappings of {length // MiB} MiB start 2 MiB-aligned; "
                   f"a touched one got {huge_kib // 1024} MiB of huge pages") | {
        "aligned": aligned, "mappings": len(addrs), "huge_kib": huge_kib}


# --- probed (a real crash) -----------------------------------------------------------------------------------

CHILD = f"""
import ctypes, mmap, os, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.memfd_create({PROBE_NAME!r})
os.ftruncate(fd, 4096)
addr = libc.mmap({PROBE_ADDR}, 4096, 3, mmap.MAP_SHARED | 0x100000, fd, 0)  # MAP_FIXED_NOREPLACE
assert addr == {PROBE_ADDR}, addr
ctypes.memset(addr, ord("A"), 4096)
# 1 MiB of private pages after it: the pipe fills and the kernel blocks with the shared page queued.
filler = mmap.mmap(-1, 1 << 20)
filler.write(b"f" * (1 << 20))
os.kill(os.getpid(), signal.SIGSEGV)
"""


def _probe_page_verdict(core: bytes) -> str:
    """'copy' or 'reference': the dumped probe page holds what it held at the crash ('A') or what the handler
    wrote into it afterwards ('B')."""
    if core[:4] != b"\x7fELF" or len(core) < 64:
        return "not-elf"
    phoff, = struct.unpack_from("<Q", core, 32)
    phentsize, phnum = struct.unpack_from("<HH", core, 54)
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr = struct.unpack_from("<IIQQ", core, phoff + i * phentsize)
        if p_type == 1 and p_vaddr == PROBE_ADDR and p_offset + 4096 <= len(core):
            page = core[p_offset:p_offset + 4096]
            return {b"A": "copy", b"B": "reference"}.get(page[:1], "garbage")
    return "no-segment"


def run_handler(result: Path, pid: str, pidfd: str | None) -> None:
    """The kernel's side: wait until the pipe stops filling (the kernel blocked with the probe page queued),
    overwrite that page through the crashed process's memfd, then read the core and see which it holds."""
    out = {"pid": int(pid), "pidfd_arg": pidfd, "pidfd_pid": None}
    if pidfd and pidfd.isdigit():
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/self/fdinfo/{pidfd}").read_text().splitlines():
                if line.startswith("Pid:"):
                    out["pidfd_pid"] = int(line.split()[1])
    last, stable = -1, 0
    for _ in range(500):  # at most 10 s; done after 200 ms without change
        avail = struct.unpack("i", fcntl.ioctl(0, termios.FIONREAD, b"\0\0\0\0"))[0]
        stable = stable + 1 if avail > 0 and avail == last else 0
        last = avail
        if stable >= 10:
            break
        time.sleep(0.02)
    out["queued_bytes"] = last
    out["overwritten"] = False
    fd_dir = Path(f"/proc/{pid}/fd")
    for entry in fd_dir.iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(entry).startswith(f"/memfd:{PROBE_NAME}"):
                fd = os.open(entry, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    out["overwritten"] = os.pwrite(fd, b"B" * 4096, 0) == 4096
                finally:
                    os.close(fd)
    core = bytearray()
    while len(core) < 64 * MiB and (block := os.read(0, MiB)):
        core += block
    out["core_bytes"] = len(core)
    out["pages"] = _probe_page_verdict(bytes(core))
    result.write_text(json.dumps(out))


def check_probe_handler(executable: str | None = None, package: Path | None = None) -> None:
    """The kernel runs the probe's handler as root: this interpreter (resolved) and the corehandler package it
    imports must be root's alone, as csplice must be (install.check_root_only), or whoever could change them
    would run code as root."""
    real = Path(os.path.realpath(executable or sys.executable))
    install.check_root_only(real, "the probe's interpreter", "doctor --probe runs it as root")
    here = Path(os.path.realpath(package or Path(__file__).resolve().parents[1]))
    install.check_root_only(here, "the corehandler package", "doctor --probe's handler imports it as root")


def probe_crash(host: Host = Host(), timeout: float = 30) -> list[dict]:
    """Crashes a throw-away process through a temporary core_pattern pointing at run_handler(), borrowing the
    host's handler (host/handler.py): the pattern is restored on every exit path. Needs root."""
    if os.geteuid() != 0:
        raise NotRootError("doctor --probe needs root: it crashes a process through a temporary core_pattern")
    check_probe_handler()
    with tempfile.TemporaryDirectory(prefix="corehandler-probe.", dir="/run") as tmp:
        result = Path(tmp) / "result.json"
        pattern = f"|{sys.executable} -P -m corehandler.host.kernelprobe handler {result} %P %F"
        if len(pattern) > 127:
            raise SystemFailure(f"probe core_pattern too long ({len(pattern)} > 127): {pattern}")
        with handler.borrow(host, "doctor --probe") as borrowed:
            borrowed.point(pattern, sysctl.read(sysctl.CORE_PIPE_LIMIT, host.sysctl_root))
            child = subprocess.run([sys.executable, "-P", "-c", CHILD], capture_output=True, timeout=timeout,
                                   preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (-1, -1)))
            deadline = time.monotonic() + timeout
            while not result.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        if child.returncode != -11:
            raise SystemFailure(f"the probe process did not die of SIGSEGV: {child.returncode} "
                                f"{child.stderr.decode(errors='replace')[-300:]}")
        if not result.exists():
            raise SystemFailure("the probe handler wrote no result: the kernel did not run it")
        out = json.loads(result.read_text())
    pages = out["pages"]
    found = [finding("coredump_use_pipe", {"reference": True, "copy": False}.get(pages), "probed",
                     {"reference": "the dump references the process's own pages (COREDUMP_USE_PIPE): a page "
                                   "changed while queued arrives changed",
                      "copy": "the kernel copies every page into the pipe (stock)"}.get(
                         pages, f"inconclusive: {pages}, page overwritten: {out['overwritten']}"))
             | {"core_bytes": out["core_bytes"], "queued_bytes": out["queued_bytes"]}]
    pidfd_ok = out["pidfd_pid"] == out["pid"]
    found.append(finding("pidfd_specifier", pidfd_ok, "probed",
                         f"%F arrived as fd {out['pidfd_arg']}, a pidfd of the crashed process" if pidfd_ok else
                         f"%F arrived as {out['pidfd_arg']!r}: not a pidfd of PID {out['pid']}"))
    return found


def survey(probe: bool = False, host: Host = Host(), sys_root: Path = Path("/sys")) -> list[dict]:
    found = [core_modes(host.sysctl_root), core_pipe_limit(host.sysctl_root), coredump_filter(host.proc_root),
             thp_mode(sys_root), zero_splice_rate(), zero_mapping_alignment()]
    if probe:
        found += probe_crash(host)
    else:
        found += [finding("coredump_use_pipe", None, "not probed", "needs a real crash: doctor --probe"),
                  finding("pidfd_specifier", None, "not probed", "needs a real crash: doctor --probe")]
    return found


if __name__ == "__main__" and len(sys.argv) >= 4 and sys.argv[1] == "handler":
    # Started by the kernel with no environment and stdio of its choosing: stdin is the core.
    run_handler(Path(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
