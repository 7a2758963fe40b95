"""The supervisor's mechanics with harmless stand-in daemons (real processes, private directories).

The real `corehandler serve` under the supervisor is exercised by tests/system/test_packaging.py.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from corehandler.cli import install as cli_install
from corehandler.config import Config
from corehandler.host import overview, supervise
from corehandler.paths import Host, Paths
from support.waiting import wait_for


def supervisors_of(paths: Paths) -> list[int]:
    """Live supervisor processes for this run directory, by their command lines."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = b"corehandler.host.supervise" in cmdline and str(paths.run_dir).encode() in cmdline
        if ours and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


@pytest.fixture
def paths(tmp_path):
    p = Paths(state_dir=tmp_path / "state", config_dir=tmp_path / "etc", run_dir=tmp_path / "run",
              log_dir=tmp_path / "log")
    yield p
    # Never leave a supervisor behind, whatever the test did.
    supervise.stop(p, timeout=5)


SLEEPER = """
    import time
    time.sleep(600)
"""


def test_start_detaches_a_locked_supervisor_and_stop_ends_it(paths, tmp_path):
    st = supervise.start(paths, command=script(tmp_path, "sleeper.py", SLEEPER))
    assert st.running and alive(st.pid) and alive(st.daemon_pid)
    assert Path(st.pid_file).read_text() == f"{st.pid}\n"
    # Double fork + setsid: a session of its own that it does not lead (so no terminal can come back), its own
    # process group, not our child.
    assert os.getsid(st.pid) not in (os.getsid(0), st.pid)
    assert os.getpgid(st.pid) == st.pid
    ppid = int(Path(f"/proc/{st.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert ppid != os.getpid()
    # The daemon runs under the supervisor, in its process group (so a last-resort killpg reaches it).
    assert os.getpgid(st.daemon_pid) == st.pid
    assert os.readlink(f"/proc/{st.daemon_pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{st.daemon_pid}/fd/1") == st.log_file
    assert stat.S_IMODE(os.stat(st.log_file).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(paths.log_dir).st_mode) == 0o750
    assert "starting: " in Path(st.log_file).read_text()
    assert stat.S_IMODE(os.stat(st.pid_file).st_mode) == 0o644  # `status` needs no root
    umask = re.search(r"^Umask:\s+(\d+)$", Path(f"/proc/{st.daemon_pid}/status").read_text(), re.M).group(1)
    assert umask == "0077"  # as corehandler.service's UMask=

    assert supervise.stop(paths) is True
    assert not alive(st.pid) and not alive(st.daemon_pid)
    assert supervise.status(paths) == supervise.Status(False, None, None, st.pid_file, st.log_file)
    assert not (paths.run_dir / supervise.PID_FILE).exists()
    assert not (paths.run_dir / supervise.SERVE_PID_FILE).exists()
    assert supervise.stop(paths) is False


def test_start_is_idempotent(paths, tmp_path):
    first = supervise.start(paths, command=script(tmp_path, "sleeper.py", SLEEPER))
    again = supervise.start(paths, command=["/bin/false"])
    assert again.pid == first.pid and again.daemon_pid == first.daemon_pid


def test_a_second_supervisor_refuses_while_the_first_holds_the_lock(paths, tmp_path):
    first = supervise.start(paths, command=script(tmp_path, "sleeper.py", SLEEPER))
    run = subprocess.run([sys.executable, "-m", "corehandler.host.supervise", "run", "--run-dir", str(paths.run_dir),
                          "--log-file", str(tmp_path / "second.log"), "--", "/bin/true"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 1
    assert supervise.status(paths).pid == first.pid and alive(first.daemon_pid)


def test_a_crashing_daemon_is_restarted_with_growing_backoff(paths, tmp_path):
    starts = tmp_path / "starts"
    crasher = script(tmp_path, "crasher.py", f"""
        with open({str(starts)!r}, "a") as f:
            f.write("x")
        raise SystemExit(3)
    """)
    st = supervise.start(paths, command=crasher)
    # Starts at about 0 s, 1 s and 3 s: a doubling backoff, not a tight loop.
    began = time.monotonic()
    wait_for(lambda: starts.exists() and len(starts.read_text()) >= 3, timeout=15, what="three starts")
    assert time.monotonic() - began >= 2.5
    log = Path(st.log_file).read_text()
    assert "the daemon exited with status 3; restarting it in 1 s" in log
    assert "the daemon exited with status 3; restarting it in 2 s" in log
    assert supervise.status(paths).running


def test_a_killed_daemon_is_replaced(paths, tmp_path):
    st = supervise.start(paths, command=script(tmp_path, "sleeper.py", SLEEPER))
    os.kill(st.daemon_pid, signal.SIGKILL)
    new = wait_for(lambda: (s := supervise.status(paths)).daemon_pid not in (None, st.daemon_pid) and s,
                   what="a new daemon")
    assert new.pid == st.pid and alive(new.daemon_pid)
    assert "was killed by SIGKILL; restarting it in 1 s" in Path(st.log_file).read_text()
    # status says the gap: how often, when, why (issue 20, item 14)
    assert st.restarts == 0 and st.last_restart is None
    assert (new.restarts, new.last_restart_why) == (1, "was killed by SIGKILL") and new.last_restart <= time.time()


def test_status_says_when_and_why_the_listener_last_restarted(paths, tmp_path, monkeypatch):
    st = supervise.start(paths, command=script(tmp_path, "listener.py", SLEEPER), service=supervise.LISTENER)
    os.kill(st.daemon_pid, signal.SIGKILL)
    wait_for(lambda: supervise.status(paths, supervise.LISTENER).daemon_pid not in (None, st.daemon_pid),
             what="a new listener")
    monkeypatch.setattr(overview.listener, "listening", lambda path, proc_root: True)
    entry = overview._listener_summary(Config(), paths, Host(), "socket")
    assert entry["restarts"] == 1 and entry["last_restart_why"] == "was killed by SIGKILL"
    line = cli_install._listener_line(entry)
    assert line.startswith("listening on ") and "; restarted 1 time, last at " in line
    assert line.endswith("(the listener was killed by SIGKILL)")
    supervise.stop(paths, timeout=5, service=supervise.LISTENER)
    assert supervise.status(paths, supervise.LISTENER).restarts == 0  # a stopped listener has no gap to tell


def test_a_clean_exit_is_not_restarted(paths, tmp_path):
    st = supervise.start(paths, command=script(tmp_path, "done.py", "import time; time.sleep(0.5)\n"))
    wait_for(lambda: not supervise.status(paths).running, what="the supervisor to finish")
    wait_for(lambda: not alive(st.pid), what="the supervisor to exit")
    assert "exited cleanly without being asked to; not restarting it" in Path(st.log_file).read_text()
    assert not (paths.run_dir / supervise.PID_FILE).exists()


def test_reload_forwards_sighup_to_the_daemon(paths, tmp_path):
    marks = tmp_path / "hups"
    st = supervise.start(paths, command=script(tmp_path, "hup.py", f"""
        import signal, time
        def on_hup(signum, frame):
            with open({str(marks)!r}, "a") as f:
                f.write("hup\\n")
        signal.signal(signal.SIGHUP, on_hup)
        print("armed", flush=True)
        while True:
            time.sleep(1)
    """))
    wait_for(lambda: "armed" in Path(st.log_file).read_text(), what="the handler to be armed")
    assert supervise.reload(paths) is True
    wait_for(lambda: marks.exists() and marks.read_text() == "hup\n", what="the daemon to see SIGHUP")
    assert supervise.status(paths).daemon_pid == st.daemon_pid  # reloaded, not restarted


def test_stop_kills_a_daemon_that_ignores_sigterm(paths, tmp_path):
    stubborn = script(tmp_path, "stubborn.py", """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("armed", flush=True)
        time.sleep(600)
    """)
    st = supervise.start(paths, command=stubborn, kill_after=1.0)
    wait_for(lambda: "armed" in Path(st.log_file).read_text(), what="SIGTERM to be ignored")
    began = time.monotonic()
    assert supervise.stop(paths, timeout=10) is True
    assert 1.0 <= time.monotonic() - began < 10
    assert not alive(st.daemon_pid) and not alive(st.pid)
    assert "ignored SIGTERM for 1 s; killing it" in Path(st.log_file).read_text()


def test_a_command_that_cannot_run_is_a_clear_error(paths, tmp_path):
    with pytest.raises(supervise.SuperviseError, match="cannot run /nonexistent/daemon: No such file"):
        supervise.start(paths, command=["/nonexistent/daemon"])
    assert not supervise.status(paths).running


def test_a_stale_pid_file_is_not_a_running_daemon(paths):
    paths.run_dir.mkdir(parents=True)
    (paths.run_dir / supervise.PID_FILE).write_text(f"{os.getpid()}\n")  # a live pid, but no lock
    assert supervise.status(paths).running is False
    assert supervise.stop(paths) is False
    assert not (paths.run_dir / supervise.PID_FILE).exists()


def test_the_callers_output_pipe_is_not_held_open(paths, tmp_path):
    """dpkg and test runners read a maintainer script's output to EOF: the daemon must not keep it open."""
    code = ("from pathlib import Path; from corehandler.host import supervise; from corehandler.paths import Paths; "
            f"supervise.start(Paths(run_dir=Path({str(paths.run_dir)!r}), log_dir=Path({str(paths.log_dir)!r})), "
            f"command=[{sys.executable!r}, {str(tmp_path / 'sleeper.py')!r}]); print('started')")
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "started\n"
    assert supervise.status(paths).running


def test_systemd_is_pid1_follows_sd_booted(tmp_path):
    assert supervise.systemd_is_pid1(tmp_path) is False
    (tmp_path / "systemd").mkdir()
    assert supervise.systemd_is_pid1(tmp_path) is False  # the package is installed, it did not boot us
    (tmp_path / "systemd" / "system").mkdir()
    assert supervise.systemd_is_pid1(tmp_path) is True


def test_serve_command_runs_this_interpreter():
    assert supervise.serve_command() == [sys.executable, "-m", "corehandler", "serve"]
    assert supervise.serve_command(Path("/etc/x"), Path("/srv/y")) == [
        sys.executable, "-m", "corehandler", "--config-dir", "/etc/x", "--state-dir", "/srv/y", "serve"]


def test_concurrent_starts_end_with_one_supervisor(paths, tmp_path):
    command = script(tmp_path, "sleeper.py", SLEEPER)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: supervise.start(paths, command=command), range(4)))
    assert len({r.pid for r in results}) == 1 and all(r.running for r in results)
    # The losers' supervisors saw the lock taken and left: one supervisor and one daemon remain.
    wait_for(lambda: supervisors_of(paths) == [results[0].pid], what="the other supervisors to exit")
    assert Path(results[0].log_file).read_text().count("starting: ") == 1


def test_an_unwritable_run_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad = Paths(run_dir=blocker / "run", log_dir=tmp_path / "log")
    with pytest.raises(supervise.SuperviseError, match=r"cannot prepare .*/file/run for the supervised daemon"):
        supervise.start(bad, command=["/bin/true"])


def test_not_running_is_the_clis_exit_5_not_3(tmp_path, monkeypatch, capsys):
    """3 is a configuration error to the CLI (errors.py); `supervise status` and `reload` say "not running"
    with 5, the system not in the state the verb expects, as `corehandler` does."""
    from corehandler.errors import EXIT_CONFLICT

    monkeypatch.setattr(supervise, "Paths", lambda: Paths(state_dir=tmp_path / "state", run_dir=tmp_path / "run",
                                                          log_dir=tmp_path / "log"))
    assert supervise.main(["status"]) == EXIT_CONFLICT
    assert supervise.main(["reload"]) == EXIT_CONFLICT
    printed = capsys.readouterr()
    assert "not running" in printed.out + printed.err
