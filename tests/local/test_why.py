"""`corehandler why PID|UNIT|EXE|ID` (cli/why.py, host/coreready.py, host/procfacts.py) on real processes: a
`prlimit --core=0`, a process that called prctl(PR_SET_DUMPABLE, 0), a setuid copy of sleep run by another user,
a coredump_filter of 0, csplice's own backlog and storm counters written by the real csplice, and a stored dump
without its core. The host's sysctls and csplice.conf are a fake tree (nothing of the host's is read or changed:
its core_pattern is whatever the machine has); every process and its /proc are real."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from corehandler import paths
from corehandler.cli import main, why
from corehandler.csplice_contract import SPECIFIERS
from corehandler.host import procfacts
from corehandler.paths import Host
from support import asuser, cbuild
from support.spoolfeed import feed, write_settings

OTHER_UID = 64123  # an ordinary uid (userview.ordinary_uid): not a system one, not nobody

# A process that turns its own dumpable flag off (as ssh-agent does), says so, and waits.
NONDUMPABLE = ("import ctypes, sys, time\n"
               "assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE\n"
               "print('ready', flush=True)\n"
               "time.sleep(300)\n")


@pytest.fixture
def fake_host(monkeypatch):
    """A host tree every user may read: core_pattern naming csplice (pipe mode), core_pipe_limit 16, the real
    fs.suid_dumpable, and a csplice.conf spooling into its own state dir. why.HOST points at it."""
    root = Path(tempfile.mkdtemp(prefix="ch-why-"))
    root.chmod(0o755)
    sys_dir = root / "proc" / "sys"
    (sys_dir / "kernel").mkdir(parents=True)
    (sys_dir / "fs").mkdir()
    # not the host's: a fake kernel's tree under a temp dir
    (sys_dir / "kernel" / "core_pattern").write_text(f"|{paths.csplice_path()} {SPECIFIERS}\n")
    (sys_dir / "kernel" / "core_pipe_limit").write_text("16\n")  # not the host's: the same fake tree
    (sys_dir / "fs" / "suid_dumpable").write_text(Path("/proc/sys/fs/suid_dumpable").read_text())
    for d in (root / "proc", sys_dir, sys_dir / "kernel", sys_dir / "fs"):
        d.chmod(0o755)
    state = root / "state"
    (state / "spool").mkdir(parents=True)
    state.chmod(0o711)
    (state / "spool").chmod(0o700)
    (root / "etc").mkdir()
    conf = write_settings(state / "csplice.conf", state / "spool")
    conf.chmod(0o644)
    monkeypatch.setattr(why, "HOST", Host(proc_root=root / "proc", csplice_settings=conf))
    yield root
    shutil.rmtree(root)


def settings(root: Path, **values) -> None:
    write_settings(root / "state" / "csplice.conf", root / "state" / "spool", **values).chmod(0o644)


def run(root: Path, *argv: str, uid: int | None = None) -> tuple[int, dict]:
    args = ["--config-dir", str(root / "etc"), "--state-dir", str(root / "state"), "--json", "why", *argv]
    if uid is None:
        return _main(args)
    got = asuser.run_as(uid, uid, args)
    assert got.returncode in (0, 1), got.stderr.decode()
    return got.returncode, json.loads(got.stdout)


def text_of(root: Path, *argv: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-P", "-c", "import sys; from corehandler.cli import why, main; "
                           "from corehandler.paths import Host; from pathlib import Path; "
                           f"why.HOST = Host(proc_root=Path({str(root / 'proc')!r}), "
                           f"csplice_settings=Path({str(root / 'state' / 'csplice.conf')!r})); "
                           "sys.exit(main(sys.argv[1:]))", "--config-dir", str(root / "etc"),
                           "--state-dir", str(root / "state"), "--no-pager", "why", *argv],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout


def checks(entry: dict) -> dict[str, dict]:
    return {c["name"]: c for c in entry["checks"]}


def spawn(argv: list[str], *, user: int | None = None, ready: bool = False) -> subprocess.Popen:
    """argv as user (default ours), with RLIMIT_CORE unlimited whatever the test runner's is."""
    def setup():  # pragma: no cover - in the child
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        if user is not None:
            os.setgroups([])
            os.setresgid(user, user, user)
            os.setresuid(user, user, user)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, preexec_fn=setup, cwd="/")
    if ready:
        assert p.stdout.readline() == b"ready\n"
    return p


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []

    def start(*args, **kwargs) -> subprocess.Popen:
        p = spawn(*args, **kwargs)
        started.append(p)
        return p
    yield start
    for p in started:
        p.kill()
        p.wait()


def test_a_plain_process_keeps_a_full_core(fake_host, processes):
    p = processes(["sleep", "300"])
    code, got = run(fake_host, str(p.pid))
    assert code == 0 and got["full_core"], got
    [entry] = got["processes"]
    assert entry["exe"] == os.path.realpath(shutil.which("sleep")) and entry["dump_bytes"] > 0
    found = checks(entry)
    assert {c["verdict"] for c in found.values()} <= {"ok", "unknown"}
    assert found["coredump_filter"]["detail"] == "0x33"
    assert [c["name"] for c in got["host"]] == ["core_pattern", "core_pipe_limit"]
    assert all(c["verdict"] == "ok" for c in got["host"])


@pytest.mark.root
def test_prlimit_core_zero_names_rlimit_core(fake_host, processes):
    p = processes(["sleep", "300"])
    subprocess.run(["prlimit", "--core=0", "--pid", str(p.pid)], check=True)
    code, got = run(fake_host, str(p.pid))
    assert code == 1 and not got["full_core"]
    found = checks(got["processes"][0])
    stops = [name for name, c in found.items() if c["verdict"] != "ok" and c["verdict"] != "unknown"]
    assert stops == ["rlimit_core"]
    assert found["rlimit_core"]["verdict"] == "stops" and "RLIMIT_CORE is 0" in found["rlimit_core"]["detail"]
    assert "ulimit -c unlimited" in found["rlimit_core"]["fix"]
    code, text = text_of(fake_host, str(p.pid))
    assert code == 1
    [line] = [x for x in text.splitlines() if x.strip().startswith("rlimit_core")]
    assert "stops the core" in line and "Fix: " in line
    assert "would NOT keep a full core" in text

    # A limit below the process's size cuts the core there.
    small = processes(["sleep", "300"])
    subprocess.run(["prlimit", "--core=4096:unlimited", "--pid", str(small.pid)], check=True)
    code, got = run(fake_host, str(small.pid))
    found = checks(got["processes"][0])
    assert code == 1 and found["rlimit_core"]["verdict"] == "cuts" and "4K" in found["rlimit_core"]["detail"]


@pytest.mark.root
def test_a_process_that_turned_dumping_off(fake_host, processes):
    # As another user: the ownership of its /proc files says it. As root without CAP_SYS_PTRACE: the probe.
    mine = processes([sys.executable, "-P", "-c", NONDUMPABLE], user=OTHER_UID, ready=True)
    root = processes(["setpriv", "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace", sys.executable, "-P",
                      "-c", NONDUMPABLE], ready=True)
    plain = processes(["sleep", "300"], user=OTHER_UID)
    for p in (mine, root):
        code, got = run(fake_host, str(p.pid))
        found = checks(got["processes"][0])
        assert code == 1 and found["dumpable"]["verdict"] == "stops", found
        assert "PR_SET_DUMPABLE, 0" in found["dumpable"]["detail"]
        assert [n for n, c in found.items() if c["verdict"] == "stops"] == ["dumpable"]
    assert checks(run(fake_host, str(plain.pid))[1]["processes"][0])["dumpable"]["verdict"] == "ok"
    # Its own user asks, without root: the same answer.
    code, got = run(fake_host, str(mine.pid), uid=OTHER_UID)
    assert code == 1 and checks(got["processes"][0])["dumpable"]["verdict"] == "stops"


@pytest.fixture
def setuid_copy():
    """setuid_copy(program): a setuid-root copy of program in a directory every user may enter."""
    asuser.named_user(OTHER_UID)
    d = Path(tempfile.mkdtemp(prefix="ch-why-suid-"))
    d.chmod(0o755)

    def make(program: str) -> Path:
        copy = d / f"suid-{program}"
        shutil.copy(shutil.which(program), copy)
        copy.chmod(0o4755)
        return copy
    yield make
    shutil.rmtree(d)


@pytest.mark.root
def test_a_setuid_program_run_by_another_user(fake_host, processes, setuid_copy):
    p = processes([str(setuid_copy("sleep")), "300"], user=OTHER_UID)
    time.sleep(0.2)  # exec'd
    _, got = run(fake_host, str(p.pid))
    found = checks(got["processes"][0])["dumpable"]
    suid = int(Path("/proc/sys/fs/suid_dumpable").read_text())
    # The host's fs.suid_dumpable decided at its exec (the fake tree has the real value): 0 makes it not dumpable,
    # 2 dumps it as root; 1 leaves it dumpable, which /proc shows nobody for a process of mixed ids.
    assert found["verdict"] == {0: "stops", 1: "unknown", 2: "ok"}[suid], found
    assert suid == 1 or "setuid root" in found["detail"]


@pytest.mark.root
def test_setuid_executable_not_running(fake_host, setuid_copy):
    copy = setuid_copy("true")
    for suid, verdict in ((0, "stops"), (2, "ok")):
        (fake_host / "proc" / "sys" / "fs" / "suid_dumpable").write_text(f"{suid}\n")
        _, got = run(fake_host, str(copy), uid=OTHER_UID)
        assert got["processes"] == [] and got["kind"] == "exe"
        found = {c["name"]: c for c in got["new_process"]}
        assert found["dumpable"]["verdict"] == verdict and "setuid root" in found["dumpable"]["detail"]


def test_coredump_filter_zero_cuts_the_core(fake_host, processes):
    p = processes([sys.executable, "-P", "-c", "import time; b = bytearray(8 << 20); print('ready', flush=True); "
                   "time.sleep(300)"], ready=True)
    Path(f"/proc/{p.pid}/coredump_filter").write_text("0")
    code, got = run(fake_host, str(p.pid))
    entry = got["processes"][0]
    found = checks(entry)["coredump_filter"]
    assert code == 1 and found["verdict"] == "cuts" and entry["coredump_filter"] == "0x0"
    assert "anonymous private memory" in found["detail"] and "only the notes and registers" in found["detail"]
    assert f"/proc/{p.pid}/coredump_filter" in found["fix"]
    # The 8 MiB buffer counts under the default filter, not under 0.
    default = procfacts.dump_size(Path(f"/proc/{p.pid}/smaps").read_text(), procfacts.DEFAULT_FILTER)
    assert entry["dump_bytes"] < 1 << 20 and default > 8 << 20


@pytest.mark.root
def test_the_spool_counters_csplice_writes(fake_host, processes):
    """The backlog and the per-executable rate, counted by the real csplice (its FNV-hashed .rate file): why
    reads the same files csplice's admission will."""
    p = processes(["sleep", "300"])
    exe = os.path.realpath(shutil.which("sleep"))
    proc_root = fake_host / "fedproc"
    (proc_root / "5301").mkdir(parents=True)
    (proc_root / "5301" / "exe").symlink_to(exe)  # csplice keys the rate on the crashed process's exe
    spool_dir = fake_host / "state" / "spool"
    conf = write_settings(fake_host / "feed.conf", spool_dir, max_per_exe_per_minute=2)
    feeder, csplice = cbuild.feeder(), paths.csplice_path()
    for _ in range(2):
        assert feed(feeder, csplice, conf, size=4096, pid=5301, proc_root=proc_root)["capture"]["dropped"] is False
    settings(fake_host, max_per_exe_per_minute=2, max_pending=8)
    code, got = run(fake_host, str(p.pid))
    found = checks(got["processes"][0])
    assert code == 1 and found["max_per_exe_per_minute"]["verdict"] == "stops"
    assert "crashed 2 times this minute" in found["max_per_exe_per_minute"]["detail"]
    assert found["max_pending"]["verdict"] == "ok" and "2 of uid 0's 8" in found["max_pending"]["detail"]
    settings(fake_host, max_per_exe_per_minute=3, max_pending=2)
    code, got = run(fake_host, str(p.pid))
    found = checks(got["processes"][0])
    assert found["max_per_exe_per_minute"]["verdict"] == "ok"
    assert code == 1 and found["max_pending"]["verdict"] == "stops"
    # A user may not read root's spool: unknown, and not counted against the answer.
    plain = processes(["sleep", "300"], user=OTHER_UID)
    code, got = run(fake_host, str(plain.pid), uid=OTHER_UID)
    found = checks(got["processes"][0])
    assert found["max_pending"]["verdict"] == "unknown" and "root's" in found["max_pending"]["detail"]


def test_size_and_floor_limits(fake_host, processes):
    p = processes([sys.executable, "-P", "-c", "import time; b = bytearray(32 << 20); print('ready', flush=True); "
                   "time.sleep(300)"], ready=True)
    settings(fake_host, max_dump_size=1 << 20)
    code, got = run(fake_host, str(p.pid))
    found = checks(got["processes"][0])
    assert code == 1 and found["max_dump_size"]["verdict"] == "cuts"
    assert "max_dump_size" in found["max_dump_size"]["fix"]
    settings(fake_host, min_free="100%")
    code, got = run(fake_host, str(p.pid))
    found = checks(got["processes"][0])
    assert code == 1 and found["min_free"]["verdict"] == "stops" and found["max_dump_size"]["verdict"] == "ok"


@pytest.mark.root
def test_another_users_process_shows_only_what_proc_shows(fake_host, processes):
    p = processes(["sleep", "300"])  # root's
    asuser.named_user(OTHER_UID)
    code, got = run(fake_host, str(p.pid), uid=OTHER_UID)
    [entry] = got["processes"]
    assert entry["exe"] is None and entry["comm"] == "sleep" and entry["dump_bytes"] is None
    assert checks(entry)["dumpable"]["verdict"] == "unknown"
    assert checks(entry)["rlimit_core"]["verdict"] == "ok"  # /proc/PID/limits is everyone's to read
    # By name: the user cannot read root's exe links, so root's sleep is not listed as one of /usr/bin/sleep's.
    _, got = run(fake_host, "sleep", uid=OTHER_UID)
    assert p.pid not in [e["pid"] for e in got["processes"]]


def test_names_are_escaped(fake_host, processes):
    # PR_SET_NAME: the comm a process chose, with a terminal escape in it.
    p = processes([sys.executable, "-P", "-c", "import ctypes, time; ctypes.CDLL(None).prctl(15, b'x\\x1b[31my', 0, "
                   "0, 0); print('ready', flush=True); time.sleep(300)"], ready=True)
    _, text = text_of(fake_host, str(p.pid))
    assert "\x1b" not in text and "x\\x1b[31my" in text


@pytest.mark.root
def test_a_stored_dump_says_why_it_has_no_core(fake_host):
    """why ID: nocore.py's sentence for a dump csplice kept as metadata only (RLIMIT_CORE 0); exit 0 for one
    with its core."""
    from corehandler.daemon import Settings
    from support.daemon_harness import Running, wait_for
    from support.spoolfeed import empty_state

    state, etc, conf = empty_state(fake_host / "stored")
    feeder, csplice = cbuild.feeder(), paths.csplice_path()
    dropped = feed(feeder, csplice, conf, size=4096, pid=5401, comm="nolimit", rlimit=0)
    kept = feed(feeder, csplice, conf, size=4096, pid=5402, comm="kept")
    with Running(Settings(state, threads=1, sweep_interval=3600)):
        wait_for(lambda: not [n for n in os.listdir(state / "spool") if n.endswith(".json")])
    args = ["--config-dir", str(etc), "--state-dir", str(state), "--json", "why"]
    code, got = _main([*args, dropped["id"]])
    assert code == 1 and not got["full_core"] and got["no_core"]["reason"] == "rlimit_core"
    assert "RLIMIT_CORE was 0" in got["no_core"]["why"]
    code, got = _main([*args, kept["id"]])
    assert code == 0 and got["full_core"] and got["no_core"] is None


def _main(argv: list[str]) -> tuple[int, dict]:
    import io
    from contextlib import redirect_stdout
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(argv)
    return code, json.loads(out.getvalue())
