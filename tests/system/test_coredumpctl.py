"""systemd's own coredumpctl on corehandler's dumps: the daemon ingests real csplice records, its journal
entries go to a real journald, and coredumpctl (systemd-coredump 252) lists, shows, dumps and debugs them from
that journal, as root and as the crashing user, who reads their own stored core through its ACL only."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from corehandler import paths
from corehandler.daemon import Settings
from corehandler.observe import journal
from corehandler.observer import Quiet
from support import cbuild
from support.daemon_harness import Running
from support.journald import PrivateJournald
from support.spoolfeed import feed, write_settings
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.journald]

USER = 4242  # an ordinary uid: the view rule shows such a user their own dumps
THEIRS, ROOTS, DROPPED = 5001, 5002, 5003
# A debugger that only says what coredumpctl gave it: its arguments and the sha256 of the core (the last one).
DEBUGGER = """#!/bin/sh
for core; do :; done
echo "$@" > "$0.args"
sha256sum < "$core" | cut -d' ' -f1 > "$0.sha256"
"""


class ToJournald(Quiet):
    """Hands the daemon's events to a JournalObserver that sends to the private journald."""

    def __init__(self, client):
        self.client = client
        self.sent = 0

    def on_ingested(self, record, stored):
        self.client.call("on_ingested", record, stored)
        self.sent += stored["status"] != "compressing"  # else on_stored brings the final entry

    def on_stored(self, record, stored):
        self.client.call("on_stored", record, stored)
        self.sent += 1


@pytest.fixture
def ingested():
    """Three dumps the daemon ingested into a state dir users can cross, and the journald holding their entries:
    one of USER's, one of root's, one kept as metadata only."""
    base = Path(tempfile.mkdtemp(prefix="corehandler-coredumpctl-"))
    os.chmod(base, 0o711)
    journald = PrivateJournald(base / "journald")
    try:
        state = base / "state"
        (state / "spool").mkdir(parents=True)
        settings = write_settings(base / "s.conf", state / "spool")
        proc = base / "proc"
        for pid in (THEIRS, ROOTS, DROPPED):
            (proc / str(pid)).mkdir(parents=True)
            (proc / str(pid) / "exe").symlink_to("/usr/bin/sleep")
        raw = {}
        for pid, uid in ((THEIRS, USER), (ROOTS, 0)):
            record = feed(cbuild.feeder(), paths.csplice_path(), settings, size=(2 << 20) + pid, pid=pid,
                          comm="crasher", uid=uid, proc_root=proc)
            raw[pid] = hashlib.sha256((state / "spool" / record["core"]).read_bytes()).hexdigest()
        feed(cbuild.feeder(), paths.csplice_path(), write_settings(base / "one.conf", state / "spool", max_pending=1),
             size=4096, pid=DROPPED, comm="crasher", uid=USER, proc_root=proc)
        journald.start()
        forward = ToJournald(journald.client())
        with Running(Settings(state, threads=1, sweep_interval=3600), [forward]):
            wait_for(lambda: forward.sent == 3, timeout=60, what="three dumps ingested")
        assert forward.client.close() == 0 and forward.client.stderr() == ""
        journald.wait_for(f"MESSAGE_ID={journal.MESSAGE_ID_COREDUMP}", count=3)
        yield base, journald, raw
    finally:
        journald.close()
        shutil.rmtree(base)


def coredumpctl(journald: PrivateJournald, *argv: str, user: int | None = None) -> subprocess.CompletedProcess:
    prefix = []
    if user is not None:
        # The user may read the journal as a member of systemd-journal may (journald's files are group-readable
        # for it on a real host); the stored core they may read only through its ACL.
        prefix = ["setpriv", f"--reuid={user}", f"--regid={user}",
                  f"--groups={grp.getgrnam('systemd-journal').gr_gid}", "--"]
    return subprocess.run([*prefix, "coredumpctl", f"--directory={journald.log_dir}", "--no-pager", *argv],
                          capture_output=True, text=True, timeout=120, cwd="/")


def test_coredumpctl_lists_shows_dumps_and_debugs_them_as_root(ingested):
    base, journald, raw = ingested
    got = coredumpctl(journald, "--json=short", "list")
    assert got.returncode == 0, got.stderr
    rows = {row["pid"]: row for row in json.loads(got.stdout)}
    assert sorted(rows) == [THEIRS, ROOTS, DROPPED]
    assert [rows[p]["corefile"] for p in (THEIRS, ROOTS, DROPPED)] == ["present", "present", "none"]
    assert (rows[THEIRS]["uid"], rows[THEIRS]["sig"], rows[THEIRS]["exe"]) == (USER, 11, "/usr/bin/sleep")

    info = coredumpctl(journald, "info", str(THEIRS))
    assert info.returncode == 0, info.stderr
    store = base / "state" / "store"
    assert f"Storage: {store}/" in info.stdout and ".zst (present)" in info.stdout
    assert "Signal: 11 (SEGV)" in info.stdout

    # coredumpctl decompresses the stored .zst itself: the bytes are the captured core's.
    for pid in (THEIRS, ROOTS):
        out = base / f"core.{pid}"
        got = coredumpctl(journald, "dump", str(pid), "-o", str(out))
        assert got.returncode == 0, got.stderr
        assert hashlib.sha256(out.read_bytes()).hexdigest() == raw[pid]
    assert coredumpctl(journald, "dump", str(DROPPED), "-o", str(base / "none")).returncode != 0

    debugger = base / "debugger"
    debugger.write_text(DEBUGGER)
    debugger.chmod(0o755)
    got = coredumpctl(journald, f"--debugger={debugger}", "-A", "--batch", "debug", str(THEIRS))
    assert got.returncode == 0, got.stderr
    assert Path(f"{debugger}.args").read_text().startswith("--batch /usr/bin/sleep -c ")
    assert Path(f"{debugger}.sha256").read_text().strip() == raw[THEIRS]


def test_coredumpctl_as_the_user_reads_their_own_core_only(ingested):
    base, journald, raw = ingested
    group = grp.getgrnam("systemd-journal").gr_gid
    for d, _, files in os.walk(journald.log_dir):
        os.chown(d, 0, group)
        os.chmod(d, 0o750)
        for name in files:
            os.chown(os.path.join(d, name), 0, group)
            os.chmod(os.path.join(d, name), 0o640)
    (base / "journald").chmod(0o755)
    got = coredumpctl(journald, "--json=short", "list", user=USER)
    assert got.returncode == 0, got.stderr
    rows = {row["pid"]: row["corefile"] for row in json.loads(got.stdout)}
    assert rows == {THEIRS: "present", ROOTS: "inaccessible", DROPPED: "none"}

    out = base / "mine"
    out.mkdir(mode=0o700)
    os.chown(out, USER, USER)
    got = coredumpctl(journald, "dump", str(THEIRS), "-o", str(out / "core"), user=USER)
    assert got.returncode == 0, got.stderr
    assert hashlib.sha256((out / "core").read_bytes()).hexdigest() == raw[THEIRS]
    got = coredumpctl(journald, "dump", str(ROOTS), "-o", str(out / "root"), user=USER)
    assert got.returncode != 0 and "Permission denied" in got.stderr
    assert (out / "root").stat().st_size == 0  # coredumpctl creates -o before it opens the core
