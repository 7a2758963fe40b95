"""What the kernel would do with a live process's core, read from /proc (for `corehandler why`, host/coreready.py):
its RLIMIT_CORE, whether it is dumpable, its coredump_filter and how many bytes a dump of it would be now.

Only what /proc shows the caller is read: a user asking about another user's process gets what any user may
read there (limits, status, coredump_filter, cgroup, comm, the ownership of /proc/PID) and `None` for the rest
(its exe link, its smaps), never a guess dressed as a fact. Everything a process chose (comm, exe, cgroup names)
is returned raw; the caller escapes it where it prints (printable.py).
"""

from __future__ import annotations

import ctypes
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from corehandler.analysis import identity

PROC = Path("/proc")
PAGE = os.sysconf("SC_PAGE_SIZE")
# The kernel's default /proc/PID/coredump_filter (MMF_DUMP_FILTER_DEFAULT): anonymous private and shared memory,
# ELF headers, private huge pages.
DEFAULT_FILTER = 0x33
FILTER_BITS = {0: "anonymous private memory (heap, stacks)", 1: "anonymous shared memory",
               2: "file-backed private mappings", 3: "file-backed shared mappings", 4: "ELF headers (build-ids)",
               5: "private huge pages", 6: "shared huge pages", 7: "private DAX pages", 8: "shared DAX pages"}
# The notes (registers, siginfo, auxv, the file list) and program headers: small beside the memory; a floor for
# the estimate so a process with nothing dumpable still counts as a few pages.
NOTES_ESTIMATE = 64 << 10


@dataclass
class Process:
    pid: int
    comm: str | None = None
    exe: str | None = None                   # None: not the caller's to read (or a kernel thread)
    uids: tuple[int, ...] = ()               # real, effective, saved, filesystem (/proc/PID/status)
    gids: tuple[int, ...] = ()
    owner: tuple[int, int] | None = None     # /proc/PID/status's uid and gid
    rlimit_soft: int | None = None           # bytes; None = unlimited
    rlimit_hard: int | None = None
    rlimit_read: bool = False
    coredump_filter: int | None = None
    rss: int | None = None                   # bytes
    vsz: int | None = None
    dump_bytes: int | None = None            # what the kernel would send now, by the smaps and the filter
    default_dump_bytes: int | None = None    # the same under the default filter
    unit: str | None = None
    user_unit: str | None = None
    cgroup: str | None = None
    kernel_thread: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def uid(self) -> int | None:
        return self.uids[0] if self.uids else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="surrogateescape")
    except OSError:
        return None


def _ids(status: str, key: str) -> tuple[int, ...]:
    m = re.search(rf"^{key}:\s+(.*)$", status, re.M)
    return tuple(int(v) for v in m.group(1).split()) if m else ()


def _kib(status: str, key: str) -> int | None:
    m = re.search(rf"^{key}:\s+(\d+) kB$", status, re.M)
    return int(m.group(1)) * 1024 if m else None


def parse_limits(text: str) -> tuple[int | None, int | None] | None:
    """(soft, hard) of `Max core file size` in /proc/PID/limits, None for unlimited; None if absent."""
    for line in text.splitlines():
        if line.startswith("Max core file size"):
            words = line[len("Max core file size"):].split()
            if len(words) >= 2:
                return tuple(None if w == "unlimited" else int(w) for w in words[:2])  # type: ignore[return-value]
    return None


def _included(flags: set[str], path: str, anonymous: int, filt: int) -> int | None:
    """Whether the kernel dumps a mapping (fs/coredump.c, vma_dump_size): None = whole, 0 = nothing, PAGE = its
    first page (an ELF header)."""
    if path in ("[vdso]", "[vsyscall]"):
        return None
    if "dd" in flags:  # VM_DONTDUMP: madvise(MADV_DONTDUMP), [vvar]
        return 0
    if "ht" in flags:
        return None if filt & (1 << (6 if "sh" in flags else 5)) else 0
    if "io" in flags:
        return 0
    if "sh" in flags:
        # An anonymous shared mapping is a file with no link (shmem, memfd, SysV): "(deleted)" in maps.
        anon = not path or path.endswith(" (deleted)") or path.startswith(("/memfd:", "/SYSV", "/dev/zero"))
        return None if filt & (1 << (1 if anon else 3)) else 0
    # Private: written to (it has anonymous pages, resident or swapped: an anon_vma) is dumped whole as anonymous
    # memory; else a file's pages per the file bits, its first page for the ELF headers.
    if anonymous > 0 and filt & 1:
        return None
    if not path.startswith("/"):
        return 0
    if filt & (1 << 2):
        return None
    return PAGE if filt & (1 << 4) and "rd" in flags else 0


def dump_size(smaps: str, filt: int) -> int:
    """The bytes of memory a core of this process would hold now under filt (the notes not counted): every
    mapping the kernel includes, whole (a pipe gets its untouched pages as zeroes)."""
    total = 0
    head: tuple[int, str] | None = None
    anonymous = 0

    def flush(flags: set[str]) -> None:
        nonlocal total
        if head is not None:
            part = _included(flags, head[1], anonymous, filt)
            total += head[0] if part is None else part

    for line in smaps.splitlines():
        if line.startswith("VmFlags:"):
            flush(set(line.split()[1:]))
            head = None
        elif line.startswith(("Anonymous:", "Swap:")):
            anonymous += int(line.split()[1])
        elif re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            words = line.split(None, 5)
            start, end = (int(x, 16) for x in words[0].split("-"))
            head, anonymous = (end - start, words[5] if len(words) > 5 else ""), 0
    return total


def read(pid: int, proc: Path = PROC) -> Process | None:
    """The process's facts; None when there is no such process."""
    base = proc / str(pid)
    status = _read(base / "status")
    if status is None:
        return None
    p = Process(pid=pid)
    p.comm = (_read(base / "comm") or "").removesuffix("\n") or None
    p.uids, p.gids = _ids(status, "Uid"), _ids(status, "Gid")
    try:
        st = os.stat(base / "status")  # a file: the directory keeps the effective ids (task_dump_owner)
        p.owner = (st.st_uid, st.st_gid)
    except OSError:
        pass
    p.rss, p.vsz = _kib(status, "VmRSS"), _kib(status, "VmSize")
    p.kernel_thread = "Kthread:\t1" in status or (p.vsz is None and not _read(base / "cmdline"))
    try:
        p.exe = os.readlink(base / "exe")
    except OSError:
        p.exe = None
    limits = parse_limits(_read(base / "limits") or "")
    if limits is not None:
        p.rlimit_soft, p.rlimit_hard = limits
        p.rlimit_read = True
    filt = (_read(base / "coredump_filter") or "").strip()
    p.coredump_filter = int(filt, 16) if re.fullmatch(r"[0-9a-fA-F]+", filt) else None
    ident = identity.parse_cgroup(identity.cgroup_path(_read(base / "cgroup")))
    p.cgroup, p.unit, p.user_unit = ident.get("cgroup"), ident.get("unit"), ident.get("user_unit")
    smaps = _read(base / "smaps")
    if smaps and p.coredump_filter is not None:
        p.dump_bytes = dump_size(smaps, p.coredump_filter) + NOTES_ESTIMATE
        p.default_dump_bytes = dump_size(smaps, DEFAULT_FILTER) + NOTES_ESTIMATE
    return p


def find_by_exe(exe: str, proc: Path = PROC) -> list[int]:
    """The PIDs whose /proc/PID/exe is exe (as the kernel shows it, " (deleted)" for a replaced file), of the
    processes whose exe link the caller may read."""
    found = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            target = os.readlink(proc / name / "exe")
        except OSError:
            continue
        if target == exe or target == exe + " (deleted)":
            found.append(int(name))
    return sorted(found)


# -- dumpable ------------------------------------------------------------------------------------------------
# The kernel shows the dumpable flag nowhere in /proc. Two things show it all the same:
# - the ownership of the files in /proc/PID (not the directory): for a process whose flag is not SUID_DUMP_USER
#   (1) the kernel makes them root's, root of the process's user namespace (task_dump_owner(), fs/proc/base.c),
#   else its effective uid's and gid's. That tells the two apart for every process whose effective uid is not that root;
# - for that root: /proc/PID/stat's start_code, which the kernel shows as 1 to whom ptrace_may_access() refuses
#   (fs/proc/array.c, do_task_stat). A reader with the process's ids and capabilities but without
#   CAP_SYS_PTRACE is refused exactly when the process is not dumpable (__ptrace_may_access's get_dumpable()
#   check; commoncap wants the reader's capabilities to cover the process's). A process that holds
#   CAP_SYS_PTRACE itself (root's daemons, usually) cannot be read so: its flag stays unknown.

DUMPABLE, NOT_DUMPABLE, DUMPABLE_UNKNOWN = "dumpable", "not dumpable", "unknown"
CAP_SYS_PTRACE = 19


def _stat_permitted(pid: int, proc: Path) -> bool | None:
    text = _read(proc / str(pid) / "stat")
    if text is None:
        return None
    words = text[text.rfind(")") + 2:].split()
    # After the comm: state is field 3, start_code field 26 (words[23]).
    return len(words) > 23 and words[23] != "1"


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _set_capabilities(caps: int) -> None:
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words
    data = (_CapData * 2)()
    for i in range(2):
        word = (caps >> (32 * i)) & 0xFFFFFFFF
        data[i].effective = data[i].permitted = word
    if ctypes.CDLL(None, use_errno=True).capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _probe_as_root(pid: int, gid: int, caps: int, proc: Path) -> bool | None:
    """_stat_permitted read by a child of uid 0, gid gid and exactly the capabilities caps."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child; ends in os._exit
        answer = b"?"
        try:
            os.close(r)
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            _set_capabilities(caps)
            got = _stat_permitted(pid, proc)
            answer = b"?" if got is None else b"1" if got else b"0"
        finally:
            os.write(w, answer)
            os._exit(0)
    os.close(w)
    try:
        answer = os.read(r, 1)
    finally:
        os.close(r)
        os.waitpid(child, 0)
    return {b"1": True, b"0": False}.get(answer)


def _userns_root(pid: int, proc: Path) -> int:
    """The host uid of root in the process's user namespace (0 outside containers)."""
    for line in (_read(proc / str(pid) / "uid_map") or "").splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "0":
            return int(words[1])
    return 0


def dumpable(p: Process, proc: Path = PROC) -> str:
    """DUMPABLE (the flag is SUID_DUMP_USER), NOT_DUMPABLE (0, or 2: dumped as root only under
    fs.suid_dumpable 2; coreready tells which) or DUMPABLE_UNKNOWN."""
    if p.owner is None or len(p.uids) < 2 or len(p.gids) < 2:
        return DUMPABLE_UNKNOWN
    euid, egid = p.uids[1], p.gids[1]
    root = _userns_root(p.pid, proc)
    if euid != root:
        return DUMPABLE if p.owner == (euid, egid) else NOT_DUMPABLE
    if p.owner != (euid, egid):
        return NOT_DUMPABLE
    # Root of its namespace: its files are root's either way. Probed only by root, only a process of our own user
    # namespace with ids all root's, and one without CAP_SYS_PTRACE.
    status = _read(proc / str(p.pid) / "status") or ""
    m = re.search(r"^CapPrm:\s+([0-9a-f]+)$", status, re.M)
    caps = int(m.group(1), 16) if m else None
    try:
        same_ns = os.readlink(proc / str(p.pid) / "ns" / "user") == os.readlink(proc / "self" / "ns" / "user")
    except OSError:
        same_ns = False
    if (os.geteuid() != 0 or caps is None or caps >> CAP_SYS_PTRACE & 1 or not same_ns or set(p.uids[:3]) != {0}
            or len(set(p.gids[:3])) != 1):
        return DUMPABLE_UNKNOWN
    try:
        got = _probe_as_root(p.pid, egid, caps, proc)
    except OSError:
        return DUMPABLE_UNKNOWN
    return DUMPABLE_UNKNOWN if got is None else DUMPABLE if got else NOT_DUMPABLE


def privileged_exe(path: str) -> str | None:
    """Why exec'ing path changes a user's ids or capabilities ("setuid root", "setgid", "file capabilities"),
    which makes the process non-dumpable under fs.suid_dumpable 0; None when it does not (or cannot be told)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    why = []
    if st.st_mode & stat.S_ISUID:
        why.append(f"setuid {'root' if st.st_uid == 0 else f'uid {st.st_uid}'}")
    if st.st_mode & stat.S_ISGID and st.st_mode & stat.S_IXGRP:
        why.append("setgid")
    try:
        if os.getxattr(path, "security.capability"):
            why.append("file capabilities")
    except OSError:
        pass
    return ", ".join(why) or None
