"""Issue 34 through the live kernel: one user's storm of `ulimit -c 0` crashes while nothing ingests (the daemon
behind, or down) fills only that user's share of the spool, the rest is shed and counted, and root's crash
meanwhile keeps its core. v0.4 wrote 658 records into a spool limited to 64 and kept root's crash as
`dropped: max_pending`."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from corehandler import spool as spoolfiles
from corehandler.config import CaptureConfig
from support.crash import build_crasher
from support.daemon_harness import wait_for
from support.host_core import capture_into

pytestmark = [pytest.mark.root, pytest.mark.live_kernel]

USER = 4321
STORM = 40


@pytest.fixture
def spool(host_core_settings):
    base = Path(tempfile.mkdtemp(prefix="cht-budgets-"))
    os.chmod(base, 0o755)  # the user runs the crasher from here
    try:
        (base / "state" / "spool").mkdir(mode=0o700, parents=True)
        capture_into(host_core_settings, base / "state", CaptureConfig.model_validate({
            "min_free": "0", "max_pending": 8, "max_pending_per_uid": 2, "max_per_exe_per_minute": 0,
            "strategy": "rw"}))
        crasher = build_crasher(base / "bin")
        os.chmod(base / "bin", 0o755)
        yield base / "state" / "spool", crasher
    finally:
        shutil.rmtree(base)


def records(spool_dir: Path) -> list[dict]:
    return [json.loads(p.read_bytes()) for p in sorted(spool_dir.glob("[!.]*.json"))]


def test_a_users_coreless_storm_stays_in_their_share_and_roots_core_is_kept(spool):
    spool_dir, crasher = spool
    as_user = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", "sh", "-c",
               f"ulimit -c 0; exec {crasher} segv 1"]
    for _ in range(STORM):
        assert subprocess.run(as_user, capture_output=True, timeout=60).returncode == -signal.SIGSEGV
    wait_for(lambda: len(records(spool_dir)) + sum(spoolfiles.shed_counts(spool_dir).values()) == STORM,
             what="every crash recorded or shed")
    theirs = records(spool_dir)
    # Twice their share; csplice lets the process go before it commits the record, so the next crash may
    # not count the last one yet: a crash or two in flight are the only slack.
    assert 4 <= len(theirs) <= 6 and {r["uid"] for r in theirs} == {USER}
    assert all(r["capture"]["dropped_reason"] == "rlimit_core" for r in theirs)
    assert spoolfiles.shed_counts(spool_dir) == {USER: STORM - len(theirs)}

    def core_unlimited():
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    root_crash = subprocess.run([str(crasher), "segv", "1"], preexec_fn=core_unlimited, capture_output=True,
                                timeout=60)
    assert root_crash.returncode == -signal.SIGSEGV
    [root] = wait_for(lambda: [r for r in records(spool_dir) if r["uid"] == 0], what="root's record")
    assert root["capture"]["complete"] and (spool_dir / root["core"]).stat().st_size > 0
