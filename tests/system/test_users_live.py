"""A real crash of a process of an ordinary user, through the live kernel's core_pattern into csplice and the
daemon: the user lists and dumps it, byte-identical to what root gets, and sees nothing of root's crash beside
it. (Not nobody: systemd-coredump's rule, ours too, gives nobody, system and dynamic uids no view.)"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from corehandler.config import Config
from corehandler.daemon import Settings
from corehandler.errors import EXIT_NOMATCH
from corehandler.store import analyses
from corehandler.store.index import Store
from support.asuser import run_as
from support.crash import build_crasher, crash
from support.daemon_harness import Running, wait_for
from support.host_core import capture_into

pytestmark = [pytest.mark.root, pytest.mark.live_kernel]

USER = 4321  # an ordinary uid; the kernel needs no passwd entry
CLI = [sys.executable, "-P", "-m", "corehandler"]


def _as_user_with_cores():
    os.setgroups([])
    os.setresgid(USER, USER, USER)
    os.setresuid(USER, USER, USER)  # execve of the crasher makes it dumpable again (SUID_DUMP_USER)
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def indexed(state: Path) -> int:
    """The dumps whose row is final: stored and analysed (a dump is listed before both)."""
    if not (state / "index.sqlite").exists():
        return 0
    with Store(state, readonly=True) as store:
        return sum(1 for d in store.all() if d.status != "compressing"
                   and (analyses.analysis_for(store, d.id) or {}).get("state") not in (None, "pending"))


def test_a_user_lists_and_dumps_their_own_real_crash_only(host_core_settings):
    base = Path(tempfile.mkdtemp(prefix="corehandler-users-live-"))
    os.chmod(base, 0o711)  # the users must reach the state dir (pytest's tmp dirs are root's, 0700)
    try:
        state, etc = base / "state", base / "etc"
        etc.mkdir(mode=0o755)
        crasher = build_crasher(base / "bin")
        os.chmod(base / "bin", 0o755)
        config = Config.model_validate({"capture": {"min_free": "0", "max_per_exe_per_minute": 0}})
        state.mkdir(mode=0o700)  # as v0.1 made it: the daemon opens it to users
        (state / "spool").mkdir(mode=0o700)
        capture_into(host_core_settings, state, config.capture)
        with Running(Settings(state, threads=1, sweep_interval=0.2)):
            theirs = subprocess.run([str(crasher), "segv", "2"], preexec_fn=_as_user_with_cores,
                                    capture_output=True, timeout=120)
            assert theirs.returncode == -signal.SIGSEGV, theirs
            assert crash(crasher, "abort", mib=2).returncode == -signal.SIGABRT
            wait_for(lambda: indexed(state) == 2, what="both crashes indexed")
            wait_for(lambda: (state / "users" / f"{USER}.json").exists(), what="the user's view published")
        with Store(state, readonly=True) as store:
            mine, roots = sorted(store.all(), key=lambda d: d.uid != USER)
        assert (mine.uid, mine.record["dumpable"], roots.uid) == (USER, 1, 0)
        argv = ["--config-dir", str(etc), "--state-dir", str(state)]
        got = run_as(USER, USER, argv + ["list"])
        assert got.returncode == 0, got.stderr
        [row] = got.stdout.decode().splitlines()[1:]
        assert row.split()[3:5] == [str(mine.pid), str(USER)] and mine.id in row
        # The view carries the analysis too, as coredumpctl shows a user their own trace.
        with Store(state, readonly=True) as store:
            signature_id = analyses.analysis_for(store, mine.id)["signature_id"]
        assert signature_id and signature_id in row, row
        info = run_as(USER, USER, argv + ["info", mine.id])
        assert info.returncode == 0 and b"Stack trace of thread" in info.stdout, info
        got = run_as(USER, USER, argv + ["list", "--signature", signature_id])
        assert got.returncode == 0 and mine.id.encode() in got.stdout, got
        as_root = subprocess.run(CLI + argv + ["dump", mine.id], capture_output=True, check=True, timeout=120)
        got = run_as(USER, USER, argv + ["dump", mine.id])
        assert got.returncode == 0 and hashlib.sha256(got.stdout).digest() == hashlib.sha256(as_root.stdout).digest()
        assert len(got.stdout) == mine.raw_bytes > 2 << 20
        for word in (roots.id, str(roots.pid)):
            assert run_as(USER, USER, argv + ["info", word]).returncode == EXIT_NOMATCH
    finally:
        shutil.rmtree(base)
