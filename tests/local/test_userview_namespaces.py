"""A container's crash is not its host namesake's (issue 34): a pod running as uid 4321 on a host whose login
user is 4321 must not publish its dumps to that user. Real processes in real namespaces, csplice started as the
kernel starts it reading their real /proc, the record put in a real index, and userview.visible() asked."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corehandler.store import userview
from corehandler.store.dumprow import row_from_record
from corehandler.store.index import Store
from support.csplice_harness import Handler, core_args

pytestmark = pytest.mark.root

USER = 4321
AS_USER = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups"]

# A user namespace made by root whose uid 0 is host uid USER, as a runtime makes a pod's (hostUsers: false):
# the child unshares, root writes its maps, the child becomes its namespace's root (host uid USER) and sleeps.
ROOT_MADE_USERNS = """
import ctypes, os, sys
if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:
    sys.exit("unshare: " + os.strerror(ctypes.get_errno()))
os.write(1, b"ready\\n")
os.read(0, 1)
os.setgid(0)
os.setuid(0)
os.execvp("sleep", ["sleep", "60"])
"""


def _child(pid: int) -> int:
    """The one child of pid (unshare --fork's), once it has exec'd."""
    for _ in range(100):
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children and Path(f"/proc/{children[0]}/comm").read_text().strip() == "sleep":
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError(f"no sleeping child of {pid}")


def _exec_done(proc: subprocess.Popen) -> int:
    for _ in range(100):
        if Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep":
            return proc.pid
        time.sleep(0.05)
    raise AssertionError(f"{proc.args} did not exec sleep")


def _root_made_userns() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", ROOT_MADE_USERNS], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    Path(f"/proc/{proc.pid}/setgroups").write_text("deny")
    Path(f"/proc/{proc.pid}/uid_map").write_text(f"0 {USER} 1")
    Path(f"/proc/{proc.pid}/gid_map").write_text(f"0 {USER} 1")
    proc.stdin.write(b"x")
    proc.stdin.flush()
    return proc, _exec_done(proc)


def _start(kind: str) -> tuple[subprocess.Popen, int]:
    if kind == "host":
        proc = subprocess.Popen([*AS_USER, "sleep", "60"])
        return proc, _exec_done(proc)
    if kind == "own user namespace":  # the user's own `unshare -Ur`, a rootless container
        proc = subprocess.Popen([*AS_USER, "unshare", "-Ur", "sleep", "60"])
        return proc, _exec_done(proc)
    if kind == "pod":  # a container without a user namespace: its own PID, IPC and UTS namespaces
        proc = subprocess.Popen(["unshare", "--pid", "--fork", "--ipc", "--uts", *AS_USER, "sleep", "60"])
        return proc, _child(proc.pid)
    return _root_made_userns()


@pytest.mark.parametrize("kind, shown", [("host", True), ("own user namespace", True), ("pod", False),
                                         ("root's user namespace", False)])
def test_a_dump_is_shown_to_its_uid_only_when_the_process_was_that_users(tmp_path, kind, shown):
    if os.geteuid() != 0:
        pytest.skip("needs root: the processes run as another uid, in namespaces root makes")
    handler = Handler(tmp_path / "h")
    proc, pid = _start(kind)
    try:
        args = core_args(pid, uid=USER)
        args[8] = b"0"  # ulimit -c 0: a record without a core, which needs no auxv to be shown
        record = handler.feed(4096, pid=pid, args=args).record
    finally:
        proc.kill()
        proc.wait()
    assert record["proc"]["verified"] and record["uid"] == USER
    assert record["proc"]["userns_owner"] == (USER if kind == "own user namespace" else 0)
    with Store(tmp_path / "state") as store:
        store.insert(row_from_record(record, status="dropped", problem=None, path=None, raw_bytes=0,
                                     stored_bytes=0, sha256=None))
        assert userview.visible(store.get(record["id"])) is shown
