"""The analyser's jail: run as `python -I -S jail.py SPEC_FD` by unwind.py, as root, it vets the files the core
says were mapped, builds the unwinder a private read-only view of the system, drops every privilege and execs
the unwinder (eu-stack; for the Python frames, pyframes.py's reader: this interpreter running pystack).
Standard library only: it runs without the venv's site-packages, and as a fresh process rather than a preexec
hook of the daemon's threaded process.

In order, each step with why:
1. Vet the core's NT_FILE paths as the crashing user (its uid, gid and groups as effective ids; a crash of a
   container or another namespace as this analysis's own uid: unwind.foreign), in the host's mount namespace
   (the crashing process's is usually gone by now, and entering one its owner shapes would let them steer
   root's lookups): absolute and canonical (the kernel writes them so), every component reached without a
   symlink (O_NOFOLLOW), the last a regular file (checked on an O_PATH fd, so a device's driver is never
   opened and a FIFO never blocks), and readable by that user (reopened through /proc/self/fd as them). A
   path failing any of these is not shown to the unwinder, and the report says why: a user's core cannot
   make us read what the user could not, and a file absent and one they may not reach read alike. From each
   vetted fd it reads the ELF facts the daemon reports (build-id, own symbols: the report's `files`): no
   other process opens a path a core names.
2. A mount, network, IPC and PID namespace of its own. A tmpfs becomes its root, holding: the system's
   program trees read-only (/usr and the merged-/usr links: the unwinder's own libraries and /usr/lib/debug),
   /etc/ld.so.cache, a /proc of its PID namespace showing its own processes only (the core is its inherited
   fd, opened as /proc/self/fd/N), the debug files the daemon fetched (<state>/debuginfo, read-only), the
   analyser's own files outside those trees (spec `binds`: pystack's package and the script that runs it), and
   each vetted file at its own path (bound read-only, or copied when the analysis's uid could not read it: a
   user's private binary, up to a cap). Nothing else of the state dir, /home, /tmp or /dev is there, so an
   unvetted path names nothing. The tmpfs is mounted over /tmp first, so each source is an fd taken before (a
   state dir or a program under the host's /tmp is reachable by nothing else), and it is built with umask
   022 whatever the daemon's, so the analysis's uid can cross every directory of it. The PID namespace's
   init (forked here) waits for the unwinder and exits, which ends every process the unwinder left; this
   process waits outside it and ends as the unwinder did (enter_pid_namespace).
3. Every capability out of the bounding set, no groups, the analysis's own uid and gid (ANALYSIS_ID_BASE +
   this process's PID: no other analysis and no file shares it), PR_SET_NO_NEW_PRIVS, the rlimits, low
   priority, a seccomp filter (no ptrace, process_vm_readv/writev, pidfd_getfd, unshare, setns, nor a clone
   into a new user namespace), exec.
Where the host refuses namespaces (a unit's RestrictNamespaces), step 2 is skipped and said so; the unwinder
then runs unprivileged on the host's view. Where the uid cannot be dropped (no analyser user, no CAP_SETUID),
nothing runs: the unwinder never runs as root.

The report (JSON, to the report fd) says what applied, which paths were refused, and any error.
"""

from __future__ import annotations

import ctypes
import errno
import grp
import json
import os
import platform
import pwd
import resource
import shutil
import signal
import stat
import struct
import sys

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWNET = 0x00020000, 0x08000000, 0x40000000
CLONE_NEWUSER, CLONE_NEWPID = 0x10000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 22, 24, 38
# Each analysis's own uid and gid: this base plus the jail's PID, unique among live processes (a PID is at
# most 2^22) and reused only once that analysis's PID namespace is gone. The range is one systemd's
# UIDS-GIDS.md leaves unused (1879048192-2147352575): above the container ranges (systemd-nspawn's
# 524288-1879048191, the kubelet's from 65536 by 65536 per pod, subuid's from 100000), below the foreign range
# and 2^31, named by no passwd entry and owning no file (checked before use).
ANALYSIS_ID_BASE = 0x70000000
IOPRIO_SET = {"x86_64": 251, "aarch64": 30}
# The system's program trees, as they are on this host (a directory bound read-only, or a merged-/usr link).
SYSTEM_TREES = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
MOUNT_POINT = "/tmp"  # the tmpfs root is mounted over it, in the jail's own namespace only
MAX_FILES = 4096
MAX_REFUSED = 32
UNSEEN = "not found or not readable by the crashing user"

if __name__ == "__main__":
    # Run as a script (-I -S): elffile alone (standard library only, light), from our package's directory,
    # appended so that the standard library keeps every name; not the package, whose metadata lookup cost
    # ~0.2 s a run, nor elfcore, whose imports cost 16 ms of CPU.
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import elffile
else:
    from corehandler import elffile

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode("utf-8", "surrogateescape")
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _bind_ro(source: str, target: str, extra: int = 0) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | extra)


# -- 1. vetting, as the crashing user ------------------------------------------------------------------------

def vet(path: str) -> tuple[int | None, str | None]:
    """(a read-only fd of the file at path, None) or (None, why it is refused); runs with the crashing user's
    effective ids."""
    parts = path.split("/")
    if not path.startswith("/") or any(p in ("", ".", "..") for p in parts[1:]):
        return None, "not a canonical absolute path"
    if path.endswith(" (deleted)"):
        return None, "deleted since it was mapped"
    fds = [os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        for part in parts[1:-1]:
            fds.append(os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1]))
        fds.append(os.open(parts[-1], os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1]))
        st = os.fstat(fds[-1])
        if stat.S_ISLNK(st.st_mode):
            return None, "a symlink"
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        fd = os.open(f"/proc/self/fd/{fds[-1]}", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
        return fd, None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            return None, "a symlink on the way"
        # Absent and not allowed read alike: a user learns nothing of a directory they may not search.
        return None, UNSEEN
    finally:
        for fd in fds:
            os.close(fd)


def _groups(spec: dict) -> list[int]:
    return [g for g in spec.get("groups") or [] if isinstance(g, int) and g >= 0][:64]


def vet_all(spec: dict, report: dict) -> dict[str, int]:
    crashing = spec.get("crashing") or {}
    uid, gid = crashing.get("uid"), crashing.get("gid")
    if not (isinstance(uid, int) and isinstance(gid, int) and uid >= 0 and gid >= 0):
        # A crash of no known user (an orphan's record): vetted as the analyser, the least of anyone.
        user = spec.get("user") or {}
        uid, gid, crashing = user.get("uid"), user.get("gid"), {}
    as_user = os.geteuid() == 0 and isinstance(uid, int) and isinstance(gid, int)
    if as_user:
        os.setgroups(_groups(crashing))
        os.setegid(gid)
        os.seteuid(uid)
    vetted: dict[str, int] = {}
    exe = spec.get("exe")
    try:
        for path in list(dict.fromkeys(spec.get("files") or []))[:MAX_FILES]:
            fd, why = vet(path)
            if fd is not None:
                vetted[path] = fd
                _read_facts(report, path, fd)
            else:
                _refuse(report, path, why)
            if path == exe:
                report["exe"] = _exe_facts(report, path, fd, why)
        if exe and "exe" not in report:
            fd, why = vet(exe)
            if fd is not None:
                _read_facts(report, exe, fd)
            report["exe"] = _exe_facts(report, exe, fd, why)
            if fd is not None:
                os.close(fd)
    finally:
        if as_user:
            os.seteuid(0)
            os.setegid(0)
            os.setgroups([])
    return vetted


def _read_facts(report: dict, path: str, fd: int) -> None:
    """What the daemon says of a mapped ELF file (symbols.py: its build-id, whether it has its own symbols;
    reason.py: glibc's __abort_msg), read here from the fd the crashing user's vetting opened: the daemon opens
    no path a core names."""
    try:
        if not elffile.is_elf(fd):
            return
        notes, names = elffile.notes_of(fd), elffile.section_names(fd)
        facts = {"build_id": elffile.build_id_of(notes), "symbols": bool(names & elffile.SYMBOL_SECTIONS)}
        if elffile.LIBC_NAME.match(os.path.basename(path)):  # where glibc keeps its abort message (reason.py)
            facts["abort_msg"] = elffile.dynsym_value(fd, b"__abort_msg")
    except OSError:  # an I/O error of the file: nothing is said of it
        return
    report["files"][path] = facts


def _exe_facts(report: dict, path: str, fd: int | None, why: str | None) -> dict:
    """The exe's vetting and build-id, and whether it is a CPython interpreter (exports `_PyRuntime`, 3.7 on,
    or `Py_Initialize`): pyframes.py reads its Python frames then, whatever the file is called."""
    python = False
    if fd is not None:
        try:
            python = any(elffile.dynsym_value(fd, name) for name in (b"_PyRuntime", b"Py_Initialize"))
        except OSError:
            pass
    return {"refused": why, "build_id": _build_id(report, path), "python": python}


def _build_id(report: dict, path: str) -> str | None:
    return (report["files"].get(path) or {}).get("build_id")


def _refuse(report: dict, path: str, why: str) -> None:
    report["refused_count"] += 1
    if len(report["refused"]) < MAX_REFUSED:
        report["refused"].append([path, why])


# -- 2. the view -----------------------------------------------------------------------------------------------

def _under_system_tree(path: str) -> bool:
    return path.split("/")[1] in SYSTEM_TREES


def _place(root: str, path: str, *, directory: bool = False) -> str:
    """root + path, with the directories leading to it (0755: main() set the umask, whatever the daemon's)."""
    target = root + path
    os.makedirs(target if directory else os.path.dirname(target), mode=0o755, exist_ok=True)
    return target


def _hold(paths, report: dict) -> dict[str, int]:
    """An O_PATH fd of each existing directory of paths, taken before the tmpfs covers MOUNT_POINT: a state
    dir under /tmp is reachable only through it afterwards. One not there yet (nothing fetched) is skipped."""
    held = {}
    for directory in paths:
        if not directory.startswith("/") or _under_system_tree(directory) or directory in held:
            continue
        try:
            held[directory] = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        except OSError as e:
            report["notes"].append(f"debug directory {directory} not shown to the unwinder: {e.strerror}")
    return held


def _readable_by_analyser(st: os.stat_result, uid: int | None) -> bool:
    return bool(st.st_mode & stat.S_IROTH) or st.st_uid == uid


def build_view(spec: dict, vetted: dict[str, int], report: dict) -> str:
    root = MOUNT_POINT
    copy_budget = int(spec.get("copy_bytes", 0))
    # The analyser's own files outside the system trees (a test's stand-in unwinder; pystack's package in the
    # daemon's venv and the script that runs it): held open now, as the tmpfs may cover their paths.
    programs = {path: os.open(path, os.O_PATH | os.O_CLOEXEC)
                for path in dict.fromkeys([spec["argv"][0], *(spec.get("binds") or [])])
                if not _under_system_tree(path)}
    debug_dirs = _hold((spec.get("debuginfo") or "").split(":"), report)
    _mount("corehandler-analysis", root, "tmpfs", MS_NOSUID | MS_NODEV,
           f"mode=0755,size={copy_budget + (4 << 20)}")
    for name in SYSTEM_TREES:
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), f"{root}/{name}")
        elif os.path.isdir(host):
            os.mkdir(f"{root}/{name}", 0o755)
            _bind_ro(host, f"{root}/{name}")
    if os.path.isfile("/etc/ld.so.cache"):
        open(_place(root, "/etc/ld.so.cache"), "w").close()
        _bind_ro("/etc/ld.so.cache", f"{root}/etc/ld.so.cache")
    if os.path.isdir("/etc/alternatives"):  # Debian's links of /usr/bin/awk and friends
        os.makedirs(f"{root}/etc/alternatives", 0o755)
        _bind_ro("/etc/alternatives", f"{root}/etc/alternatives")
    # Its own processes only (hidepid=invisible, and it is the only process of its uid); the core is read
    # through /proc/self/fd, where the kernel checks the analyser's read access as for any open.
    os.mkdir(f"{root}/proc", 0o755)
    _mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible,subset=pid")
    # The debug files the daemon fetched by build-id (analysis/debuginfod.py), read-only at their path, which
    # eu-stack's --debuginfo-path names beside its relative and system entries.
    for directory, fd in debug_dirs.items():
        try:
            _bind_ro(f"/proc/self/fd/{fd}", _place(root, directory, directory=True), MS_NOEXEC)
        except OSError as e:
            report["notes"].append(f"debug directory {directory} not shown to the unwinder: {e.strerror}")
        finally:
            os.close(fd)
    for path, fd in programs.items():
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            _place(root, path, directory=True)
        else:
            open(_place(root, path), "w").close()
        _bind_ro(f"/proc/self/fd/{fd}", root + path)
        os.close(fd)
    analyser_uid = (spec.get("user") or {}).get("uid")  # this analysis's own
    for path, fd in vetted.items():
        if _under_system_tree(path):
            continue  # the read-only system tree holds it already, at the path just vetted
        try:
            st = os.fstat(fd)
            target = _place(root, path)
            if _readable_by_analyser(st, analyser_uid):
                open(target, "w").close()
                _bind_ro(f"/proc/self/fd/{fd}", target, MS_NOEXEC)
            elif st.st_size <= copy_budget:
                copy_budget -= st.st_size
                with open(os.dup(fd), "rb") as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.chmod(target, 0o444)
                report["copied"] += 1
            else:
                _refuse(report, path, "private to its user and over the copy budget")
        except OSError as e:
            _refuse(report, path, f"cannot place it in the view: {e.strerror}")
    return root


# -- 3. privileges -------------------------------------------------------------------------------------------

def analysis_user(spec: dict, report: dict) -> dict | None:
    """The uid and gid this analysis runs as: its own (ANALYSIS_ID_BASE + our PID), else the analyser's system
    user when a passwd or group entry claims that number."""
    own = ANALYSIS_ID_BASE + os.getpid()
    try:
        pwd.getpwuid(own)
    except KeyError:
        try:
            grp.getgrgid(own)
        except KeyError:
            report["applied"].append("own-uid")
            return {"uid": own, "gid": own}
    report["notes"].append(f"uid {own} is taken on this host: the unwinder runs as the analyser's shared user")
    return spec.get("user")


# seccomp: the unwinder may not trace or read another process, nor make a user namespace (where it would hold
# every capability again). clone3's flags are behind a pointer a filter cannot read: ENOSYS makes the C
# library fall back to clone, whose flags it can.
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_DENIED = {"x86_64": {"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438,
                      "unshare": 272, "setns": 308},
           "aarch64": {"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438,
                       "unshare": 97, "setns": 268}}
_CLONE = {"x86_64": 56, "aarch64": 220}
_CLONE3 = 435
_X32_BIT = 0x40000000
SECCOMP_MODE_FILTER = 2
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
LD_ABS_W, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]] | None:
    """The filter's BPF (code, jt, jf, k), None on an architecture it does not know."""
    if machine not in _DENIED:
        return None
    prog = [(LD_ABS_W, 0, 0, 4), (JEQ, 1, 0, _AUDIT_ARCH[machine]), (RET, 0, 0, RET_KILL_PROCESS), (LD_ABS_W, 0, 0, 0)]
    if machine == "x86_64":  # x32's numbers share the arch token: none is the unwinder's
        prog += [(JGE, 0, 1, _X32_BIT), (RET, 0, 0, RET_KILL_PROCESS)]
    for nr in _DENIED[machine].values():
        prog += [(JEQ, 0, 1, nr), (RET, 0, 0, RET_ERRNO | errno.EPERM)]
    prog += [(JEQ, 0, 1, _CLONE3), (RET, 0, 0, RET_ERRNO | errno.ENOSYS)]
    # clone's flags are its first argument, whose low 32 bits the (little-endian) seccomp_data holds at 16
    prog += [(JEQ, 0, 3, _CLONE[machine]), (LD_ABS_W, 0, 0, 16), (JSET, 0, 1, CLONE_NEWUSER),
             (RET, 0, 0, RET_ERRNO | errno.EPERM), (RET, 0, 0, RET_ALLOW)]
    return prog


def filter_syscalls(report: dict) -> None:
    prog = seccomp_program(platform.machine())
    if prog is None or sys.byteorder != "little":
        report["notes"].append(f"no system call filter for {platform.machine()}")
        return
    insns = (_SockFilter * len(prog))(*[_SockFilter(*i) for i in prog])
    fprog = _SockFprog(len(prog), insns)
    _check(_libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0),
           "installing the system call filter")
    report["applied"].append("seccomp")


def drop(user: dict, last: int) -> None:
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap}")
    os.setgroups([])
    os.setresgid(user["gid"], user["gid"], user["gid"])
    os.setresuid(user["uid"], user["uid"], user["uid"])  # clears the permitted and effective sets


def limit(spec: dict, report: dict) -> None:
    limits = spec.get("limits") or {}
    for name, key in (("RLIMIT_AS", "memory_bytes"), ("RLIMIT_CPU", "cpu_seconds"), ("RLIMIT_FSIZE", "output_bytes")):
        if key in limits:
            resource.setrlimit(getattr(resource, name), (limits[key], limits[key]))
    # 1, not 0: the kernel skips a dump of a process whose RLIMIT_CORE is 1 (fs/coredump.c's guard for a core
    # handler's own helpers), so a crashing analyser never reaches our own spool.
    resource.setrlimit(resource.RLIMIT_CORE, (1, 1))
    report["applied"].append("limits")
    os.nice(19)
    report["applied"].append("nice")
    # Python ignores these, and an ignored signal stays ignored across exec: the unwinder must die of SIGXFSZ
    # at its output cap, not carry on with EFBIG.
    for sig in (signal.SIGXFSZ, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    number = IOPRIO_SET.get(platform.machine())
    if number is not None and _libc.syscall(number, 1, 0, (2 << 13) | 7) == 0:  # self, best-effort level 7
        report["applied"].append("ionice")


def _exit_as(status: int) -> None:
    """Ends this process as the wait status says the unwinder ended: the daemon reads its signal or code."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (1, 1))  # our own death by SIGSEGV must not reach the spool
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 70)


def enter_pid_namespace() -> int:
    """Forks the first process (init) of the PID namespace unshare() made, and returns in it the fd its
    unwinder's wait status goes to. This process, outside the namespace, waits for the init and ends as the
    unwinder did; killing it (the daemon's timeout kills our whole process group) kills the init, and with
    it every process of the namespace, a `setsid` one included."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _check(_libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0), "PR_SET_PDEATHSIG")
        return w
    os.close(w)
    _, status = os.waitpid(pid, 0)
    raw = os.read(r, 4)
    _exit_as(struct.unpack("i", raw)[0] if len(raw) == 4 else status)
    raise AssertionError("not reached")


def init_and_wait(status_fd: int) -> None:
    """In the namespace's init: forks the process that becomes the unwinder (it returns here) and waits for it;
    the init's exit then ends whatever the unwinder left in the namespace."""
    pid = os.fork()
    if pid == 0:
        os.close(status_fd)
        return
    _, status = os.waitpid(pid, 0)
    os.write(status_fd, struct.pack("i", status))
    os._exit(0)


def run(spec: dict, report: dict) -> None:
    with open("/proc/sys/kernel/cap_last_cap") as f:  # read before the view hides /proc/sys
        last_cap = int(f.read())
    view = pid_ns = False
    root = os.geteuid() == 0
    # Started by a thread that stepped aside for a capture (idlecpus.StepAside), it inherited SCHED_IDLE, and no
    # wait's end reaches another process: on a busy host it would spend its time budget waiting for a CPU. Left
    # before the drop, while leaving it is allowed; nice 19 follows (limit). idlecpus.not_idle does the same for
    # the sealer, but this file runs apart from the package and imports none of it.
    if os.sched_getscheduler(0) == os.SCHED_IDLE:
        try:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            report["applied"].append("not-idle")
        except OSError as e:
            report["notes"].append(f"left SCHED_IDLE as inherited ({e.strerror})")
    if root:
        if not spec.get("user"):
            raise PermissionError(errno.EPERM, "no analyser user to run as (corehandler install makes it)")
        try:
            _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC), "unshare")
            _mount(None, "/", None, MS_REC | MS_PRIVATE)
            report["applied"].append("namespaces")
            view = True
        except OSError as e:
            report["notes"].append(f"no namespaces of its own ({e.strerror}): the unwinder sees the host's files")
        if view:
            try:
                _check(_libc.unshare(CLONE_NEWPID), "unshare")
                pid_ns = True
            except OSError as e:
                report["notes"].append(f"no PID namespace of its own ({e.strerror}): what the unwinder starts "
                                       "may outlive it")
        spec = dict(spec, user=analysis_user(spec, report))
    status_fd = enter_pid_namespace() if pid_ns else None
    if status_fd is not None:
        report["applied"].append("pid-namespace")
    # Vetted in the namespace the view is built in: a bind mount takes its source from this namespace only.
    vetted = vet_all(spec, report)
    if view:
        os.chroot(build_view(spec, vetted, report))
        os.chdir("/")
        report["applied"].append("private-view")
    for fd in vetted.values():
        os.close(fd)
    core_fd, user = spec["core_fd"], spec.get("user")
    if root:  # readable by this analysis's group while it runs; unwind.cancel() gives the core its own back
        os.fchown(core_fd, -1, user["gid"])
        os.fchmod(core_fd, 0o640)
    os.set_inheritable(core_fd, True)
    if status_fd is not None:
        init_and_wait(status_fd)
    if root:
        drop(user, last_cap)
        report["applied"] += ["uid", "no-capabilities"]
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    report["applied"].append("no-new-privs")
    limit(spec, report)
    filter_syscalls(report)
    argv = spec["argv"]  # it names the core as /proc/self/fd/CORE_FD, the fd it inherits
    _write_report(spec, report)
    try:
        os.execve(argv[0], argv, spec.get("env") or {})
    except OSError as e:
        raise OSError(e.errno, f"cannot run {argv[0]}: {e.strerror}") from None


def _write_report(spec: dict, report: dict) -> None:
    fd = spec.get("report_fd")
    if fd is not None:
        os.pwrite(fd, json.dumps(report).encode(), 0)


def main(argv: list[str]) -> int:
    with open(int(argv[1]), "rb") as f:
        spec = json.loads(f.read())
    if spec.get("report_fd") is not None:  # the unwinder must not write our report
        os.set_inheritable(spec["report_fd"], False)
    report = {"applied": [], "refused": [], "refused_count": 0, "copied": 0, "notes": [], "error": None,
              "files": {}}
    # What the view's tmpfs gets must be crossable by the analyser's uid: the daemon runs with UMask=0077
    # (corehandler.service), which would make every directory leading to a vetted file root's alone.
    os.umask(0o022)
    try:
        run(spec, report)
    except OSError as e:
        report["error"] = str(e.strerror or e) + (f" ({e.filename})" if e.filename else "")
        _write_report(spec, report)
        return 70
    return 71  # not reached: run() execs


if __name__ == "__main__":
    sys.exit(main(sys.argv))
