"""Versions of the index on a real state dir: read verbs refuse an index of another schema and leave it as it
was; `corehandler migrate` migrates after a backup; a crash mid-migration leaves the old index; the daemon over
an index a newer version wrote exits once with EXIT_INDEX_NEWER, under the supervisor too (no restart loop)."""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from corehandler import __version__, daemonlock
from corehandler.cli import main
from corehandler.daemon import Settings
from corehandler.errors import EXIT_CONFLICT, EXIT_INDEX_NEWER, EXIT_INDEX_OLDER
from corehandler.host import supervise
from corehandler.paths import Paths
from corehandler.store.index import SCHEMA_VERSION, Store
from support.daemon_harness import Running
from support.indexrows import schema_2_index
from support.waiting import wait_for

SERVE = [sys.executable, "-P", "-m", "corehandler"]


@pytest.fixture
def old(tmp_path):
    """A state dir holding a schema-2 index, and a config dir with the metrics off (no port to take)."""
    state, etc = tmp_path / "state", tmp_path / "etc"
    schema_2_index(state)
    (state / "spool").mkdir()
    etc.mkdir()
    (etc / "corehandler.toml").write_text("[metrics]\nenabled = false\n")
    return state, etc


def newer(state: Path) -> None:
    """The index as a newer corehandler (9.1.0) would leave it, after migrating it here first."""
    with Store(state, migrate=True) as s:
        s.db.execute("UPDATE written_by SET version = '9.1.0'")
        s.db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        s.db.commit()


def cli(capsys, old, *argv) -> tuple[int, str, str]:
    state, etc = old
    code = main(["--config-dir", str(etc), "--state-dir", str(state), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_read_verbs_refuse_an_older_index_and_leave_it_as_it_was(capsys, old):
    state, _ = old
    before = digest(state / "index.sqlite")
    for verb in (["list"], ["info", "1"], ["list", "--json=short"]):
        code, out, err = cli(capsys, old, *verb)
        assert code == EXIT_INDEX_OLDER and out == "" and len(err.splitlines()) == 1
        assert err.startswith(f"corehandler: {state / 'index.sqlite'} was written by an older corehandler "
                              f"(schema 2), older than this corehandler {__version__}")
    assert digest(state / "index.sqlite") == before
    assert sorted(p.name for p in state.iterdir()) == ["index.sqlite", "spool", "store"]


def test_migrate_backs_up_then_migrates_once_and_check_answers_for_scripts(capsys, old):
    state, _ = old
    code, out, _ = cli(capsys, old, "migrate", "--check")
    assert code == 0 and "migrates it to schema" in out
    code, out, _ = cli(capsys, old, "migrate")
    assert code == 0 and out.startswith("Migrated the index from an older corehandler (schema 2)")
    assert (state / "index.schema-2.sqlite").exists()
    code, out, _ = cli(capsys, old, "migrate")
    assert code == 0 and out.strip() == f"{state / 'index.sqlite'} is already at schema {SCHEMA_VERSION}"
    assert cli(capsys, old, "list")[0] == 0
    # What an older package's preinst asks before a downgrade: can a corehandler of its schema use the index?
    code, out, err = cli(capsys, old, "migrate", "--check", "--schema", str(SCHEMA_VERSION - 1))
    assert code == EXIT_INDEX_NEWER and out == "" and len(err.splitlines()) == 1
    assert f"corehandler {__version__} (schema {SCHEMA_VERSION})" in err
    assert f"restore {state / 'index.schema-2.sqlite'} after the downgrade" in err
    assert cli(capsys, old, "migrate", "--check", "--schema", str(SCHEMA_VERSION))[0] == 0


def test_migrate_refuses_under_a_running_daemon(capsys, old):
    state, _ = old
    lock = daemonlock.hold(state / "daemon.lock")
    try:
        code, _, err = cli(capsys, old, "migrate")
    finally:
        os.close(lock)
    assert code == EXIT_CONFLICT and f"another corehandler daemon (pid {os.getpid()})" in err
    assert not (state / "index.schema-2.sqlite").exists()


def test_the_daemon_migrates_once_after_a_backup_and_says_so_once(old, caplog):
    state, _ = old
    with caplog.at_level(logging.INFO, logger="corehandler.daemon"):
        for _ in range(2):  # a start, then a restart
            with Running(Settings(state, threads=1, sweep_interval=3600)) as daemon:
                pass
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Migrated the index")]
    assert said == [f"Migrated the index from an older corehandler (schema 2) to corehandler {__version__} (schema "
                    f"{SCHEMA_VERSION}); the old index is kept as {state / 'index.schema-2.sqlite'} (the newest 2 "
                    "such copies are kept)"]
    assert daemon.store.migration is None
    with Store(state, readonly=True) as s:
        assert len(s.all()) == 2


def test_a_newer_index_stops_the_daemon_once_with_the_way_back(old):
    state, etc = old
    newer(state)
    before = digest(state / "index.sqlite")
    run = subprocess.run(SERVE + ["--config-dir", str(etc), "--state-dir", str(state), "serve"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == EXIT_INDEX_NEWER
    assert run.stderr.splitlines()[-1] == (
        f"corehandler: {state / 'index.sqlite'} was written by corehandler 9.1.0 (schema {SCHEMA_VERSION + 1}), "
        f"newer than this corehandler {__version__} (schema {SCHEMA_VERSION}): restore "
        f"{state / 'index.schema-2.sqlite'} (the index before it was migrated) or install corehandler 9.1.0 or "
        "newer again")
    assert digest(state / "index.sqlite") == before


def test_the_supervisor_does_not_restart_a_daemon_refused_by_a_newer_index(old, tmp_path):
    state, etc = old
    newer(state)
    paths = Paths(state_dir=state, config_dir=etc, run_dir=tmp_path / "run", log_dir=tmp_path / "log")
    try:
        st = supervise.start(paths, command=SERVE + ["--config-dir", str(etc), "--state-dir", str(state), "serve"])
        wait_for(lambda: not supervise.status(paths).running, timeout=60, what="the supervisor to give up")
    finally:
        supervise.stop(paths, timeout=5)
    log = Path(st.log_file).read_text()
    assert log.count("starting: ") == 1 and "newer than this corehandler" in log
    assert f"the daemon exited with status {EXIT_INDEX_NEWER}" in log and "not restarting it" in log


def test_the_unit_does_not_restart_a_daemon_refused_by_a_newer_index():
    unit = (Path(__file__).parents[2] / "packaging" / "systemd" / "corehandler.service").read_text()
    assert f"RestartPreventExitStatus={EXIT_INDEX_NEWER}" in unit.splitlines()
    assert supervise.NO_RESTART == (EXIT_INDEX_NEWER,)


CRASH_MID_MIGRATION = """
    import os, sqlite3, sys
    real = sqlite3.connect
    def connect(*args, **kwargs):
        db = real(*args, **kwargs)
        # The migration's last statement before its commit: every table altered, nothing committed.
        db.set_trace_callback(lambda sql: os._exit(9) if sql.startswith("PRAGMA user_version=") else None)
        return db
    sqlite3.connect = connect
    from corehandler.store.index import Store
    Store(sys.argv[1], migrate=True)
    os._exit(0)
"""


def test_a_crash_mid_migration_leaves_the_old_index_usable(tmp_path):
    schema_2_index(tmp_path)
    crash = tmp_path / "crash.py"
    crash.write_text(textwrap.dedent(CRASH_MID_MIGRATION))
    run = subprocess.run([sys.executable, "-P", str(crash), str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 9, run.stderr
    assert (tmp_path / "index.schema-2.sqlite").exists()  # the backup came first
    db = sqlite3.connect(f"file:{tmp_path / 'index.sqlite'}?mode=ro", uri=True)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    assert "deleted_at" in {r[1] for r in db.execute("PRAGMA table_info(dumps)")}
    assert db.execute("SELECT COUNT(*) FROM dumps").fetchone()[0] == 3
    assert not db.execute("SELECT name FROM sqlite_master WHERE name IN ('written_by', 'resymbolise')").fetchall()
    db.close()
    with Store(tmp_path, migrate=True) as s:  # the next start migrates it whole
        assert s.migration.before.schema == 2 and len(s.all()) == 2
