"""A daemon's liveness is its own lock (daemonlock.py): held for its life, naming its pid and start, readable by
any user's `status`, gone with the process however it ends."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from corehandler import daemonlock
from corehandler.errors import CorehandlerError

HOLDER = ("import sys, time; from pathlib import Path; from corehandler import daemonlock\n"
          "daemonlock.hold(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)")


def test_the_lock_names_its_daemon_and_dies_with_it(tmp_path):
    lock = tmp_path / "daemon.lock"
    assert daemonlock.holder(lock) is None
    before = time.time()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "held\n"
        found = daemonlock.holder(lock)
        assert found.pid == proc.pid and before - 1 <= found.since <= time.time()
        assert stat.S_IMODE(os.stat(lock).st_mode) == 0o644
        with pytest.raises(CorehandlerError, match=f"another corehandler daemon \\(pid {proc.pid}\\) is running"):
            daemonlock.hold(lock)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert daemonlock.holder(lock) is None  # SIGKILL too: no pid file left to lie
    fd = daemonlock.hold(lock)
    assert daemonlock.holder(lock).pid == os.getpid()
    os.close(fd)
    assert daemonlock.holder(lock) is None


def test_a_lock_someone_planted_as_a_symlink_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (tmp_path / "daemon.lock").symlink_to(victim)
    with pytest.raises(CorehandlerError, match="cannot open the daemon's lock"):
        daemonlock.hold(tmp_path / "daemon.lock")
    assert victim.read_text() == "untouched" and daemonlock.holder(tmp_path / "daemon.lock") is None
