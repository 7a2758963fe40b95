"""The index records the version that wrote it; only a migrating open (the daemon, `corehandler migrate`) changes
an older one, after a backup; a read-only open never writes; an index a newer version wrote is refused."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

from corehandler import __version__
from corehandler.errors import EXIT_INDEX_NEWER, EXIT_INDEX_OLDER
from corehandler.store import index
from corehandler.store.index import SCHEMA_VERSION, IndexNewerError, IndexOlderError, Store
from support.indexrows import record as _record
from support.indexrows import schema_2_index


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_reading_an_older_index_refuses_and_writes_nothing(tmp_path):
    path = schema_2_index(tmp_path)
    before = digest(path)
    for kwargs in ({"readonly": True}, {}):  # the read verbs; analyze and vacuum (they write, never migrate)
        with pytest.raises(IndexOlderError) as refused:
            Store(tmp_path, **kwargs)
        assert refused.value.exit_code == EXIT_INDEX_OLDER
        message = refused.value.message
        assert "\n" not in message and "schema 2" in message and f"corehandler {__version__}" in message
        assert "`corehandler migrate`" in message and "the daemon migrates it when it starts" in message
    assert digest(path) == before and index.backups(tmp_path) == []
    assert {p.name for p in tmp_path.iterdir()} == {"index.sqlite", "store"}  # no -wal, -shm or journal made


def test_a_newer_index_is_refused_naming_both_versions_and_the_way_back(tmp_path):
    path = schema_2_index(tmp_path)
    with Store(tmp_path, migrate=True) as s:  # leaves index.schema-2.sqlite
        s.db.execute("UPDATE written_by SET version = '9.1.0'")
        s.db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        s.db.commit()
    before = digest(path)
    for kwargs in ({"readonly": True}, {}, {"migrate": True}):
        with pytest.raises(IndexNewerError) as refused:
            Store(tmp_path, **kwargs)
        assert refused.value.exit_code == EXIT_INDEX_NEWER
        assert refused.value.message == (
            f"{path} was written by corehandler 9.1.0 (schema {SCHEMA_VERSION + 1}), newer than this corehandler "
            f"{__version__} (schema {SCHEMA_VERSION}): restore {tmp_path / 'index.schema-2.sqlite'} (the index "
            "before it was migrated) or install corehandler 9.1.0 or newer again")
    assert digest(path) == before


def test_a_migration_backs_the_old_index_up_first_and_records_its_writer(tmp_path):
    schema_2_index(tmp_path)
    with Store(tmp_path, migrate=True) as s:
        done = s.migration
        assert index.index_version(s.db) == index.IndexVersion(SCHEMA_VERSION, __version__)
        assert [d.id for d in s.all()] == [_record(1)["id"], _record(2)["id"]]
    assert done.backup == tmp_path / "index.schema-2.sqlite" and done.before == index.IndexVersion(2, None)
    assert (done.backup.stat().st_mode & 0o777) == 0o600
    copy = sqlite3.connect(f"file:{done.backup}?mode=ro", uri=True)
    assert copy.execute("PRAGMA user_version").fetchone()[0] == 2
    assert copy.execute("SELECT COUNT(*) FROM dumps").fetchone()[0] == 3  # the tombstone too: as it was
    assert copy.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # one file, whole
    copy.close()
    assert done.describe().startswith(f"Migrated the index from an older corehandler (schema 2) to "
                                      f"corehandler {__version__} (schema {SCHEMA_VERSION}); the old index is kept "
                                      f"as {done.backup}")
    with Store(tmp_path, migrate=True) as s:
        assert s.migration is None  # once
    with Store(tmp_path, readonly=True) as s:
        assert len(s.all()) == 2


def test_the_newest_backups_are_kept(tmp_path):
    schema_2_index(tmp_path)
    db = sqlite3.connect(tmp_path / "index.sqlite")
    db.execute("PRAGMA user_version=6")
    db.commit()
    db.close()
    for old in (1, 2):
        (tmp_path / f"index.schema-{old}.sqlite").write_bytes(b"an older copy")
    with Store(tmp_path, migrate=True) as s:
        assert s.migration.removed == (tmp_path / "index.schema-1.sqlite",)
    assert [n for n, _ in index.backups(tmp_path)] == [2, 6] and index.BACKUPS_KEPT == 2


def test_a_newer_patch_release_records_itself_as_the_writer(tmp_path):
    with Store(tmp_path) as s:
        s.db.execute("UPDATE written_by SET version = '0.0.1'")
        s.db.commit()
    with Store(tmp_path, readonly=True) as s:
        assert index.index_version(s.db).version == "0.0.1"  # a reader records nothing
    with Store(tmp_path, migrate=True) as s:
        assert s.migration is None and index.index_version(s.db).version == __version__
