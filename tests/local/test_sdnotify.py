"""The daemon tells systemd it is ready and alive (Type=notify, WatchdogSec= in corehandler.service): the real
daemon with the real systemd-python sd_notify, to a notification socket of the test's own."""

from __future__ import annotations

import os
import socket

from corehandler.daemon import Settings
from corehandler.observe.sdnotify import SystemdNotifier
from support.daemon_harness import Running
from support.waiting import wait_for


def test_ready_then_watchdog_at_every_sweep_then_stopping(tmp_path, monkeypatch):
    path = tmp_path / "notify"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(path))
    receiver.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    got: list[str] = []

    def received() -> list[str]:
        while True:
            try:
                got.append(receiver.recv(4096).decode())
            except BlockingIOError:
                return got

    state = tmp_path / "state"
    (state / "spool").mkdir(parents=True)
    try:
        with Running(Settings(state, threads=1, sweep_interval=0.1), [SystemdNotifier()]):
            wait_for(lambda: sum(m.startswith("WATCHDOG=1") for m in received()) >= 3, what="watchdog pings")
        received()
    finally:
        receiver.close()
    assert got[0] == "READY=1\nSTATUS=Watching the spool"
    assert "WATCHDOG=1\nSTATUS=0 dumps stored (0 bytes), 0 waiting in the spool" in got
    assert got[-1] == "STOPPING=1"


def test_without_systemd_it_says_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = SystemdNotifier()
    notifier.on_start()
    notifier.on_state(0, 0, 0)
    notifier.close()
    assert "NOTIFY_SOCKET" not in os.environ


def test_serve_tells_systemd(tmp_path):
    """`corehandler serve`, as corehandler.service runs it (Type=notify), says READY and then STOPPING on TERM.
    Its state dir is not the host's handler's: it leaves the host's csplice.conf alone."""
    import signal
    import subprocess
    import sys

    path = tmp_path / "notify"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(path))
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "corehandler.toml").write_text("[metrics]\nenabled = false\n[journal]\nenabled = false\n")
    env = dict(os.environ, NOTIFY_SOCKET=str(path))
    daemon = subprocess.Popen([sys.executable, "-P", "-m", "corehandler", "--config-dir", str(tmp_path / "etc"),
                               "--state-dir", str(tmp_path / "state"), "serve"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        receiver.settimeout(60)
        assert receiver.recv(4096) == b"READY=1\nSTATUS=Watching the spool"
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0, daemon.stderr.read()
        receiver.setblocking(False)
        last = []
        while True:
            try:
                last.append(receiver.recv(4096))
            except BlockingIOError:
                break
        assert last[-1] == b"STOPPING=1"
    finally:
        if daemon.poll() is None:
            daemon.kill()
        daemon.stderr.close()
        receiver.close()
