"""The analyser's jail (corehandler/analysis/jail.py) against real crashes cored by gdb: the unwinder runs as
its own user with no capabilities and no-new-privs in a private view, and the files a core names reach it
only vetted as the crashing user (issue 20, item 3)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import struct
import tempfile
from pathlib import Path

import pytest

from corehandler.analysis import debuginfod, findings, jail, symbols, unwind
from support import debuginfod_server, realcore
from support.waiting import wait_for

pytestmark = pytest.mark.root

USER = 4242  # a crashing user: vetting takes its ids, no passwd entry needed
OTHER = 4343  # another user, owning a private directory
IN_OPEN = 0x20


@pytest.fixture(scope="module", autouse=True)
def _tools():
    for tool in ("gdb", "eu-stack", "gcc"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is missing: scripts/install-deps installs it (scripts/apt/*.txt)")


@pytest.fixture
def open_dir():
    """A directory every user can reach (pytest's own are root's 0700), removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="corehandler-jail-"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base)


def _crash(open_dir: Path):
    binary = realcore.build(open_dir / "bin", name="analysed")
    os.chmod(open_dir / "bin", 0o755)
    return realcore.crash(binary, open_dir / "core", "segv")


def _as_user(c, **proc):
    return dict(realcore.record_for(c, "id", **proc), uid=USER, gid=USER)


def _functions(result) -> list:
    return [f["function"] for t in result["threads"] for f in t["frames"]]


def test_a_fifo_planted_at_a_mapped_path_is_refused_not_waited_for(open_dir):
    c = _crash(open_dir)
    c.binary.rename(open_dir / "bin" / "moved")
    os.mkfifo(c.binary, 0o666)
    r = unwind.analyse(c.core, _as_user(c), findings.Limits(timeout=20))
    assert r["state"] != findings.TIMEOUT, r["problems"]
    assert any(f"{c.binary}: not a regular file" in p for p in r["problems"]), r["problems"]
    assert r["exe"]["state"] == "unreadable"


def test_a_device_at_a_mapped_path_is_never_opened(open_dir):
    c = _crash(open_dir)
    c.binary.unlink()
    os.symlink("/dev/zero", c.binary)
    r = unwind.analyse(c.core, _as_user(c), findings.Limits(timeout=20))
    assert r["state"] != findings.TIMEOUT
    assert any(f"{c.binary}: a symlink" in p for p in r["problems"]), r["problems"]


def test_a_root_only_elf_gives_a_user_no_symbols(open_dir):
    c = _crash(open_dir)
    visible = unwind.analyse(c.core, _as_user(c))
    assert "crash_segv" in _functions(visible)  # readable by the user: symbolised
    os.chmod(c.binary, 0o700)
    hidden = unwind.analyse(c.core, _as_user(c))
    assert "crash_segv" not in json.dumps(hidden), hidden["threads"][0]["frames"][:2]
    assert any("not readable by the crashing user" in p for p in hidden["problems"])
    assert hidden["exe"]["state"] == "unreadable" and hidden["exe"]["disk_build_id"] is None
    # root's own crash of it keeps its symbols
    assert "crash_segv" in _functions(unwind.analyse(c.core, realcore.record_for(c, "id")))


def test_a_users_private_binary_is_still_symbolised(open_dir):
    c = _crash(open_dir)
    os.chown(c.binary, USER, USER)
    os.chmod(c.binary, 0o700)  # the user's, unreadable by the analyser's uid: copied into its view
    r = unwind.analyse(c.core, _as_user(c))
    assert "crash_segv" in _functions(r) and r["exe"]["state"] == "same"


def test_fetched_debug_files_under_tmp_reach_the_unwinder(open_dir):
    """The debug-file cache of a state dir under /tmp, where the view's tmpfs is mounted: bound from an fd taken
    before, so the stripped program's frames get their names (a path looked up afterwards names nothing)."""
    disk, served, build_id = debuginfod_server.stripped_with_debug_file(open_dir)
    c = realcore.crash(disk, open_dir / "core", "segv")
    cache = open_dir / "state" / debuginfod.CACHE_DIR
    limits = findings.Limits(timeout=60, debuginfo_path=debuginfod.search_path(cache.parent))
    assert "crash_segv" not in _functions(unwind.analyse(c.core, _as_user(c), limits))
    debug_file = debuginfod.cached(cache, build_id)
    debug_file.parent.mkdir(parents=True)
    shutil.copyfile(served / "analysed.debug", debug_file)
    for path in (debug_file, *debug_file.parents):
        if path == open_dir:
            break
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    r = unwind.analyse(c.core, _as_user(c), limits)
    assert "crash_segv" in _functions(r), (r["threads"][0]["frames"][:2], r["problems"])


def test_under_the_units_umask_a_program_outside_the_system_trees_keeps_its_symbols(open_dir):
    """corehandler.service runs the daemon with UMask=0077: the view's directories leading to a vetted file
    are still crossable by the analyser's uid."""
    c = _crash(open_dir)
    old = os.umask(0o077)
    try:
        r = unwind.analyse(c.core, _as_user(c), findings.Limits(timeout=60))
    finally:
        os.umask(old)
    assert "crash_segv" in _functions(r), (r["threads"][0]["frames"][:2], r["problems"])


def _stand_in(monkeypatch, directory: Path, script: str) -> Path:
    """A shell script the jail runs in the unwinder's place (a compromised unwinder, as far as the jail can
    tell), at a path outside the system trees: the jail binds it into the view."""
    fake = directory / "fake-eu-stack"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    real = unwind._tool
    monkeypatch.setattr(unwind, "_tool", lambda name: str(fake) if name == "eu-stack" else real(name))
    return fake


def _status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # gone meanwhile
        return {}
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines())}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _descendants(pid: int) -> list[int]:
    """The processes below pid, by their parents (a setsid one stays below its parent until that exits)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = _status(int(entry)).get("PPid")
            if ppid:
                parents[int(entry)] = int(ppid)
    found, frontier = [], {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier}
        found += sorted(frontier)
    return found


def _unwinder(run, name: str = "sleep") -> int:
    """The host PID of the process the stand-in exec'd, below the jail."""
    jailed = run.stack.proc.pid
    return wait_for(lambda: next((p for p in [jailed, *_descendants(jailed)] if _status(p).get("Name") == name),
                                 None), timeout=30, what=f"the analyser exec'd {name}")


def test_the_analyser_runs_as_its_own_user_without_privileges_or_our_files(open_dir, tmp_path, monkeypatch):
    c = _crash(open_dir)
    _stand_in(monkeypatch, tmp_path, "echo 'TID 1:'\nexec sleep 600\n")
    before = os.stat(c.core)
    run = unwind.start(c.core, _as_user(c), findings.Limits(timeout=60))
    try:
        pid = _unwinder(run)
        status = _status(pid)
        own = jail.ANALYSIS_ID_BASE + run.stack.proc.pid  # this analysis's own uid and gid, nobody else's
        assert status["Uid"].split() == [str(own)] * 4 and status["Gid"].split() == [str(own)] * 4
        assert status["Groups"].split() == []
        assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == int(status["CapBnd"], 16) == 0
        assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"
        for ns in ("mnt", "net", "ipc", "pid"):
            assert os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
        assert status["NSpid"].split()[-1] == "2"  # under the namespace's init, which waits for it
        # Its root holds the system's program trees, its /proc and the stand-in, nothing of our state.
        root = Path(f"/proc/{pid}/root")
        assert not (root / "var").exists() and not (root / "home").exists() and not (root / "dev").exists()
        assert (root / "usr" / "bin" / "eu-stack").exists()
        # The core is read through the fd it inherited, for the analysis only; nothing else of ours is open.
        assert os.stat(c.core).st_gid == own
        assert set(os.listdir(f"/proc/{pid}/fd")) == {"0", "1", "2", str(run.core_fd)}
    finally:
        unwind.cancel(run)
    after = os.stat(c.core)
    assert (after.st_mode, after.st_gid) == (before.st_mode, before.st_gid)


# -- no path a core names is opened outside the jail, nor by anything but O_PATH before it is checked ----------

class _Opens:
    """inotify's IN_OPEN on a few inodes: every real open(2) of them (O_PATH opens are not reported)."""

    def __init__(self, *paths: Path):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0
        for p in paths:
            assert libc.inotify_add_watch(self.fd, os.fsencode(p), IN_OPEN) >= 0, p

    def count(self) -> int:
        try:
            raw = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return 0
        n, at = 0, 0
        while at < len(raw):
            _, mask, _, length = struct.unpack_from("iIII", raw, at)
            n += bool(mask & IN_OPEN)
            at += 16 + length
        return n

    def close(self) -> None:
        os.close(self.fd)


def _analyse_as_the_daemon_does(core: Path, record: dict, state: Path) -> dict:
    result = unwind.analyse(core, record, findings.Limits(timeout=20))
    symbols.annotate(result, state)
    return result


@pytest.mark.parametrize("planted", ["fifo", "device", "symlink to a device"])
def test_what_is_at_a_mapped_path_now_is_never_opened_unless_a_regular_file(open_dir, planted):
    """A symlink swap after the crash (or a tmpfs of a user's own mount namespace) puts a FIFO or a device
    node where the core says a file was mapped: neither the jail nor the daemon ever opens it, for a user's
    crash or root's (a watchdog's node would reboot the host)."""
    c = _crash(open_dir)
    c.binary.unlink()
    node = open_dir / "node"
    if planted == "fifo":
        os.mkfifo(c.binary, 0o666)
        node = c.binary
    else:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's: harmless to open, yet seen
        if planted == "device":
            os.rename(node, c.binary)
            node = c.binary
        else:
            os.symlink(node, c.binary)
    opens = _Opens(node)
    try:
        for record in (_as_user(c), realcore.record_for(c, "id")):
            r = _analyse_as_the_daemon_does(c.core, record, open_dir / "state")
            assert opens.count() == 0, f"{planted} opened for uid {record['uid']}"
            assert r["state"] != findings.TIMEOUT and r["exe"]["disk_build_id"] is None, r["exe"]
            exe = next(m for m in r["modules"] if m["name"] == str(c.binary))
            assert exe["symbols"] == symbols.GONE and "disk" not in exe
    finally:
        opens.close()


def test_a_file_in_another_users_private_directory_reads_as_a_missing_one(open_dir):
    """What the daemon says of a user's crash tells them nothing of a directory they may not search: the
    result with the file there is the result with it gone."""
    private = open_dir / "private"
    binary = realcore.build(private, name="analysed")
    c = realcore.crash(binary, open_dir / "core", "segv")
    os.chown(private, OTHER, OTHER)
    os.chmod(private, 0o700)

    def said():
        r = _analyse_as_the_daemon_does(c.core, _as_user(c), open_dir / "state")
        exe = next(m for m in r["modules"] if m["name"] == str(binary))
        return r["exe"], exe["symbols"], [p for p in r["problems"] if str(private) in p]
    # root's crash of it is read where it is: the file is there
    r = _analyse_as_the_daemon_does(c.core, realcore.record_for(c, "id"), open_dir / "state")
    assert r["exe"]["state"] == "same" and "crash_segv" in _functions(r)
    there = said()
    binary.unlink()
    gone = said()
    assert there == gone, (there, gone)
    assert there[0]["state"] == "unreadable" and there[1] == symbols.GONE


# -- one analysis cannot reach another, nor outlive its own ----------------------------------------------------

# The stand-in's findings, as the function of its one frame (the marker is split in the script, whose own open
# fd would match it otherwise).
_FRAME = 'echo "TID 1:"; echo "#0  0x0000000000000001 $found - x"\n'
_MARKER = "corehandler-sec" "ret-7d1f"


def _function(r) -> str:
    return r["threads"][0]["frames"][0]["function"]


def test_an_analysis_cannot_read_another_running_analysiss_core(open_dir, tmp_path, monkeypatch):
    """A compromised unwinder looks through /proc for the fds of the other analyses: a user's core held by
    another analysis running meanwhile is not there for it (seen on one shared uid: it was read)."""
    c = _crash(open_dir)
    secret = open_dir / "secret.core"
    shutil.copyfile(c.core, secret)
    with open(secret, "ab") as f:
        f.write(_MARKER.encode())
    _stand_in(monkeypatch, tmp_path,
              'core=${1#--core=}; m="corehandler-sec""ret-7d1f"\n'
              'if grep -q "$m" "$core"; then echo "TID 1:"; exec sleep 600; fi\n'
              # (the .core files only: grep reading its own output's memory file would never end)
              'n=0; for f in /proc/[0-9]*/fd/*; do case "$(readlink "$f")" in\n'
              '*.core) grep -q "$m" "$f" 2>&- && n=$((n+1));; esac; done\n'
              'found="stolen=$n"\n' + _FRAME)
    victim = unwind.start(secret, _as_user(c), findings.Limits(timeout=60))
    try:
        _unwinder(victim)  # holding the secret core open
        r = unwind.analyse(c.core, _as_user(c), findings.Limits(timeout=30))
    finally:
        unwind.cancel(victim)
    assert r["threads"] and _function(r) == "stolen=0", r["problems"]


def test_a_setsid_child_of_the_unwinder_does_not_outlive_the_analysis(open_dir, tmp_path, monkeypatch):
    c = _crash(open_dir)
    # (setsid forks itself: the view has no /dev/null for the shell's `&`)
    _stand_in(monkeypatch, tmp_path, "setsid -f sleep 6061\nsetsid -f sh -c 'sleep 6062'\nfound=left\n" + _FRAME)

    def left():
        return [p for p in map(int, filter(str.isdigit, os.listdir("/proc")))
                if _cmdline(p).startswith(b"sleep\x00606") or b"\x00sleep 606" in _cmdline(p)]
    for runs in ("ended", "killed"):
        limits = findings.Limits(timeout=30 if runs == "ended" else 2)
        if runs == "killed":
            _stand_in(monkeypatch, tmp_path, "setsid -f sleep 6063\nexec sleep 600\n")
        r = unwind.analyse(c.core, _as_user(c), limits)
        assert (r["state"] == findings.TIMEOUT) == (runs == "killed"), r["problems"]
        stayed = left()
        for p in stayed:  # not to leave them to the next test
            os.kill(p, 9)
        assert stayed == [], f"the unwinder's children outlived the analysis it {runs}"


def test_the_unwinder_may_not_trace_read_another_process_or_make_a_user_namespace(open_dir, tmp_path, monkeypatch):
    c = _crash(open_dir)
    _stand_in(monkeypatch, tmp_path, """found=$(python3 -I -S - <<'PY'
import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(ret):
    return "ok" if ret >= 0 else os.strerror(ctypes.get_errno()).replace(" ", "_")
child = subprocess.Popen(["sleep", "100"])
out = {"ptrace": errno_of(libc.ptrace(16, child.pid, None, None))}  # PTRACE_ATTACH to its own child
buf = ctypes.create_string_buffer(8)
iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
out["process_vm_readv"] = errno_of(libc.process_vm_readv(os.getpid(), iov, 1, iov, 1, 0))
out["unshare"] = errno_of(libc.unshare(0x10000000))  # CLONE_NEWUSER
child.kill()
print(",".join(f"{k}={v}" for k, v in out.items()))
PY
)
""" + _FRAME)
    r = unwind.analyse(c.core, _as_user(c), findings.Limits(timeout=30))
    facts = dict(kv.split("=") for kv in _function(r).split(","))
    assert facts == {"ptrace": "Operation_not_permitted", "process_vm_readv": "Operation_not_permitted",
                     "unshare": "Operation_not_permitted"}, facts
    assert {"seccomp", "pid-namespace", "own-uid"} <= set(r["sandbox"])


@pytest.mark.parametrize("where", ["user namespace", "container"])
def test_a_root_containers_crash_is_not_vetted_as_host_root(open_dir, where):
    """uid 0 of a container (or of a user namespace) is not the host's root: a root-only file of the host at
    a path its core names lends it nothing."""
    c = _crash(open_dir)
    os.chmod(c.binary, 0o700)
    assert "crash_segv" in _functions(unwind.analyse(c.core, realcore.record_for(c, "id")))  # host root's own
    if where == "user namespace":
        proc = {"ns": {"user": "user:[4026531111]", "mnt": "mnt:[4026531112]"}}
    else:
        proc = {"cgroup": "0::/system.slice/docker-" + "ab" * 32 + ".scope\n"}
    r = unwind.analyse(c.core, realcore.record_for(c, "id", **proc))
    assert "crash_segv" not in json.dumps(r), r["threads"][0]["frames"][:2]
    assert r["exe"]["state"] == "unreadable"
