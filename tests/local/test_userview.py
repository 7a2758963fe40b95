"""Users who are not root see their own crashes of dumpable processes, and nothing else (userview.py, as
coredumpctl allows). Real csplice records with the kernel's %u and %d, ingested by the real daemon, which
publishes the views; the CLI run with a real non-root uid (the kernel checks every access)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from corehandler import paths
from corehandler.cli import main
from corehandler.daemon import Settings
from corehandler.errors import EXIT_NOMATCH, EXIT_PERMISSION
from corehandler.paths import DIR_MODES
from corehandler.store import userview
from support import cbuild
from support.asuser import named_user, program_runnable_by, run_as, run_as_program
from support.daemon_harness import Running, wait_for
from support.spoolfeed import feed, write_settings

pytestmark = pytest.mark.root

USER = 4321      # an ordinary user
OTHER = 4322     # another one (no passwd entry needed: the kernel knows uids, not names)
# pid: (uid, dumpable, comm, facts). dumpable is the kernel's %d: 1 an ordinary process, 2 a setuid one dumped
# for root (suid_dumpable=2), 0 one that made itself non-dumpable. The rest stay root's by systemd-coredump's
# rule: a system, dynamic or nobody uid, and an unclean exec (effective id not the real one, AT_SECURE set).
CRASHES = {6001: (USER, 1, "mine", {}), 6002: (USER, 2, "setuid", {}), 6003: (USER, 0, "nodump", {}),
           6004: (OTHER, 1, "theirs", {}), 6005: (0, 1, "roots", {}), 6006: (500, 1, "system", {}),
           6007: (61200, 1, "dynamic", {}), 6008: (65534, 1, "nobody", {}), 6009: (USER, 1, "seteuid", {"euid": 0}),
           6010: (USER, 1, "setegid", {"egid": 0}), 6011: (USER, 1, "atsecure", {"at_secure": 1})}
HIDDEN = (6002, 6003, 6005, 6006, 6007, 6008, 6009, 6010, 6011)


@pytest.fixture(scope="module")
def published():
    if os.geteuid() != 0:
        pytest.skip("needs root: the test drops to other uids")
    # Not under pytest's tmp dir: /tmp/pytest-of-root is 0700, and the users must reach the state dir.
    base = Path(tempfile.mkdtemp(prefix="corehandler-users-"))
    os.chmod(base, 0o711)
    try:
        state, etc = base / "state", base / "etc"
        state.mkdir(mode=0o700)
        (state / "spool").mkdir(mode=0o700)  # as install makes them; the daemon opens state and store
        etc.mkdir(mode=0o755)
        settings = write_settings(base / "s.conf", state / "spool")
        shas, ids = {}, {}
        for pid, (uid, dumpable, comm, facts) in CRASHES.items():
            r = feed(cbuild.feeder(), paths.csplice_path(), settings, size=(1 << 20) + pid, pid=pid,
                     comm=comm, uid=uid, dumpable=dumpable, **facts)
            assert (r["uid"], r["dumpable"]) == (uid, dumpable)
            shas[pid] = hashlib.sha256((state / "spool" / r["core"]).read_bytes()).hexdigest()
            ids[pid] = r["id"]
        with Running(Settings(state, threads=1, sweep_interval=3600)):
            wait_for(lambda: not [n for n in os.listdir(state / "spool") if n.endswith(".json")])
        yield state, etc, shas, ids
    finally:
        shutil.rmtree(base)


def cli(published, uid: int, *argv: str):
    state, etc, *_ = published
    base = ["--config-dir", str(etc), "--state-dir", str(state)]
    return run_as(uid, uid, base + list(argv))


def listed(result) -> list[int]:
    return [int(line.split()[3]) for line in result.stdout.decode().splitlines()[1:]]


def test_a_user_lists_and_dumps_their_own_dumpable_crashes_only(published):
    state, _, shas, ids = published
    got = cli(published, USER, "list")
    assert got.returncode == 0, got.stderr
    assert listed(got) == [6001]
    got = cli(published, USER, "--json", "info", "mine")
    assert got.returncode == 0, got.stderr
    [info] = json.loads(got.stdout)
    assert info["id"] == ids[6001] and info["corefile"] == "present"
    got = cli(published, USER, "dump", ids[6001])
    assert got.returncode == 0 and hashlib.sha256(got.stdout).hexdigest() == shas[6001]
    # Another user's, a setuid program's, a non-dumpable one's, root's, a system/dynamic/nobody uid's and an
    # unclean exec's are invisible, even by their exact id: not even "denied" (coredumpctl hides them too).
    for pid in (6004, *HIDDEN):
        for verb in ("list", "info", "dump"):
            got = cli(published, USER, verb, str(pid))
            assert got.returncode == EXIT_NOMATCH and got.stdout == b"", (pid, verb, got.stderr)
        assert cli(published, USER, "info", ids[pid]).returncode == EXIT_NOMATCH
    assert listed(cli(published, OTHER, "list")) == [6004]
    for uid in (500, 61200, 65534):  # no view for them at all
        assert listed(cli(published, uid, "list")) == []


def test_root_sees_every_dump(published, capsys):
    state, etc, *_ = published
    assert main(["--config-dir", str(etc), "--state-dir", str(state), "list"]) == 0
    assert [int(line.split()[3]) for line in capsys.readouterr().out.splitlines()[1:]] == sorted(CRASHES)


def test_the_index_and_other_users_files_stay_closed(published):
    """What makes the views safe: the index is root's alone; a view and a core carry a read ACL for their
    own user only; the directories can be crossed, not listed."""
    state, _, _, ids = published
    assert stat.S_IMODE(os.stat(state / "index.sqlite").st_mode) == 0o600
    for sub, kind in (("", "state"), ("store", "store"), ("users", "users"), ("spool", "spool")):
        assert stat.S_IMODE(os.stat(state / sub).st_mode) == DIR_MODES[kind], sub
    stored = {pid: next((state / "store").glob(f"{ids[pid]}.*")) for pid in CRASHES}
    assert userview.acl_readers(stored[6001]) == [USER] and userview.acl_readers(stored[6004]) == [OTHER]
    for pid in HIDDEN:
        assert userview.acl_readers(stored[pid]) == [], pid
    assert sorted(os.listdir(state / "users")) == sorted([f"{OTHER}.json", f"{USER}.json"])
    view = (state / "users" / f"{USER}.json").read_text()
    assert "mine" in view and not any(f'"{CRASHES[pid][2]}"' in view for pid in (6004, *HIDDEN))
    # The kernel's word, as the user: the index, the other user's view and core, any listing: denied.
    probe = ("import os, sys\n"
             "def denied(f, *a):\n"
             "    try: f(*a)\n"
             "    except PermissionError: return True\n"
             "    return False\n"
             f"assert denied(open, {str(state / 'index.sqlite')!r}, 'rb')\n"
             f"assert denied(open, {str(state / 'users' / f'{OTHER}.json')!r}, 'rb')\n"
             f"assert denied(open, {str(stored[6004])!r}, 'rb')\n"
             f"assert denied(open, {str(stored[6002])!r}, 'rb')\n"
             f"for d in ({str(state)!r}, {str(state / 'store')!r}, {str(state / 'users')!r}):\n"
             "    assert denied(os.listdir, d), d\n"
             f"open({str(stored[6001])!r}, 'rb').read(1)\n")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setresgid(USER, USER, USER)
            os.setresuid(USER, USER, USER)
            exec(probe, {})
            code = 0
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def test_a_user_without_access_gets_one_line_and_exit_4(published):
    """A state dir as v0.1 made it (0700): no traceback, no 'damaged index', exit 4. vacuum is root's."""
    state, *_ = published
    os.chmod(state, 0o700)
    try:
        for argv in (["list"], ["info", "1"], ["dump", "mine"]):
            got = cli(published, USER, *argv)
            assert got.returncode == EXIT_PERMISSION and got.stdout == b"", (argv, got.stderr)
            assert len(got.stderr.splitlines()) == 1 and b"permission denied" in got.stderr, got.stderr
    finally:
        os.chmod(state, DIR_MODES["state"])
    got = cli(published, USER, "vacuum")
    assert got.returncode == EXIT_PERMISSION
    assert got.stderr == b"corehandler: vacuum deletes stored dumps and needs root\n"


def test_views_follow_deletions_and_the_index_of_an_older_version(published, capsys):
    """refresh republishes from the index: a view without a file is removed, a new one appears (the daemon
    runs it at start, so an index v0.1 wrote gets its views)."""
    state, *_ = published
    (state / "users" / f"{USER}.json").unlink()
    (state / "users" / "4242.json").write_text("{}")  # a user whose dumps are gone
    from corehandler.store.index import Store

    with Store(state) as store:
        userview.refresh(store)
    assert sorted(os.listdir(state / "users")) == sorted([f"{OTHER}.json", f"{USER}.json"])
    assert listed(cli(published, USER, "list")) == [6001]


def test_a_user_sees_their_dump_compressing_and_waits_for_its_core(published):
    """A dump the daemon listed before storing its core (status `compressing`, no file yet) is in its user's
    view as it is in the index: `list` shows it, `info` says its core is being compressed, `dump` and `debug`
    exit 5 rather than hand out the user's older dump."""
    from corehandler.errors import EXIT_CONFLICT
    from corehandler.store.dumprow import row_from_record
    from corehandler.store.index import Store

    state, _, _, ids = published
    with Store(state) as store:
        mine = store.get(ids[6001]).record
        record = dict(mine, id=mine["id"][:-4] + "6099", pid=6099, timestamp=mine["timestamp"] + 1)
        store.insert(row_from_record(record, status="compressing", problem=None, path=None, raw_bytes=1 << 20,
                                     stored_bytes=0, sha256=None))
        userview.refresh(store, [USER])
    try:
        assert listed(cli(published, USER, "list")) == [6001, 6099]
        got = cli(published, USER, "--json", "info", "6099")
        assert got.returncode == 0, got.stderr
        [info] = json.loads(got.stdout)
        assert (info["status"], info["corefile"]) == ("compressing", "compressing")
        for verb in (["dump"], ["debug", "--debugger", "true"]):
            got = cli(published, USER, *verb, "mine")
            assert got.returncode == EXIT_CONFLICT and b"still being compressed" in got.stderr, got.stderr
    finally:
        with Store(state) as store:
            store.db.execute("DELETE FROM dumps WHERE id = ?", (record["id"],))
            store.db.commit()
            userview.refresh(store, [USER])


def test_the_installed_program_as_a_user(published):
    """The same through the program and runuser, where the test venv allows it."""
    user = named_user(USER)
    why = program_runnable_by(user)
    if why:
        pytest.skip(why)
    state, etc, shas, ids = published
    base = ["--config-dir", str(etc), "--state-dir", str(state)]
    got = run_as_program(user, base + ["list"])
    assert got.returncode == 0 and [int(line.split()[3]) for line in got.stdout.decode().splitlines()[1:]] == [6001]
    got = run_as_program(user, base + ["dump", ids[6001]])
    assert got.returncode == 0 and hashlib.sha256(got.stdout).hexdigest() == shas[6001]
