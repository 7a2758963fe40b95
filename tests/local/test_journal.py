"""The journal entries JournalObserver builds, from real csplice records. (Sending them to a real journald, and
the stderr fallback when it is absent or stale, is in tests/system/test_journald.py: journal.send always uses
the host's /run/systemd/journal/socket, so only a private mount namespace keeps such tests hermetic.)"""

from __future__ import annotations

import dataclasses
import os

from corehandler.observe import journal
from support.records import RecordMaker


def test_dump_entry_from_a_real_record(feeder, csplice, tmp_path):
    maker = RecordMaker(feeder, csplice, tmp_path / "spool-root", max_dump_size=1 << 20)
    record = maker.make(3 << 20, signal=6, comm=b"cr\xffsher")
    stored = maker.store_dump(record)
    got = journal.dump_entry(record, stored)
    cap = record["capture"]
    assert got["MESSAGE_ID"] == journal.MESSAGE_ID_COREDUMP == "fc2e22bc6ee647b6b90729ab34a250b1"
    assert got["PRIORITY"] == "2"
    assert got["COREDUMP_PID"] == str(os.getpid())
    assert got["COREDUMP_SIGNAL"] == "6" and got["COREDUMP_SIGNAL_NAME"] == "SIGABRT"
    # /proc's comm (this process's) wins over the kernel's %e, which shows a '/' in a comm as '!'.
    assert got["COREDUMP_COMM"] == open("/proc/self/comm").read().rstrip("\n")
    # The process's bytes, escaped in the field as in the text (printable.py): the record keeps them.
    kernel_only = journal.dump_entry(dict(record, proc=dict(record["proc"], comm=None)), stored)
    assert kernel_only["COREDUMP_COMM"] == "cr\\xffsher"
    assert "(cr\\xffsher)" in kernel_only["MESSAGE"]  # escaped in the text
    assert got["COREDUMP_EXE"] == os.readlink("/proc/self/exe")
    assert got["COREDUMP_TIMESTAMP"] == str(record["timestamp"] * 10**6)
    assert got["COREDUMP_TRUNCATED"] == "1"
    assert got["COREHANDLER_TRUNCATED_REASON"] == "max_dump_size"
    assert got["COREHANDLER_DROPPED"] == "0" and "COREHANDLER_DROPPED_REASON" not in got
    assert got["COREHANDLER_RAW_BYTES"] == "1048576"
    assert got["COREHANDLER_DUMP_BYTES"] == str(3 << 20)
    assert got["COREHANDLER_THROUGHPUT_BYTES_PER_SECOND"] == str(round(cap["throughput_bytes_per_second"]))
    assert got["COREDUMP_FILENAME"] == stored["path"]
    assert got["COREHANDLER_ID"] == record["id"]
    assert "truncated (max_dump_size)" in got["MESSAGE"]


def test_a_dump_listed_while_compressing_then_stored(feeder, csplice, tmp_path):
    """The dump's entry comes when it is listed: its core still being compressed, it says so and names no file
    and no compressed size, under corehandler's own MESSAGE_ID; the stored entry that follows is the dump in its
    final state, under systemd's coredump MESSAGE_ID that coredumpctl lists: one such entry per dump."""
    maker = RecordMaker(feeder, csplice, tmp_path / "spool-root")
    record = maker.make(1 << 20)
    final = maker.store_dump(record)
    listed = dataclasses.replace(final, path=None, stored_bytes=None, compress_seconds=None,
                                 status="compressing")
    got = journal.dump_entry(record, listed)
    assert got["MESSAGE_ID"] == journal.MESSAGE_ID_LISTED and got["COREHANDLER_STATUS"] == "compressing"
    assert "being compressed into the store" in got["MESSAGE"]
    assert not got.keys() & {"COREDUMP_FILENAME", "COREHANDLER_STORED_BYTES", "COREHANDLER_COMPRESS_SECONDS"}
    assert got["COREHANDLER_RAW_BYTES"] == str(1 << 20)
    done = journal.stored_entry(record, final)
    assert done["MESSAGE_ID"] == journal.MESSAGE_ID_COREDUMP and done["PRIORITY"] == "6"
    assert done["COREHANDLER_ID"] == record["id"] and done["COREHANDLER_STATUS"] == "ok"
    assert done["COREDUMP_FILENAME"] == final["path"]
    assert done["COREHANDLER_STORED_BYTES"] == str(final["stored_bytes"])
    # Everything coredumpctl shows, as in the listed entry.
    assert {k: v for k, v in done.items() if k.startswith("COREDUMP_") and k != "COREDUMP_FILENAME"} == \
        {k: v for k, v in got.items() if k.startswith("COREDUMP_")}
    assert done["MESSAGE"].endswith(f"stored as {final['path']}")


def test_deletion_and_error_entries():
    deleted = journal.deleted_entry("dump-1", None, "max_age", 4096)
    assert deleted["MESSAGE_ID"] == journal.MESSAGE_ID_DELETED and deleted["PRIORITY"] == "6"
    assert deleted["MESSAGE"] == "Removed dump dump-1 (unknown executable) by retention rule max_age, freed 0.0 MiB"
    assert "COREDUMP_EXE" not in deleted and deleted["COREHANDLER_FREED_BYTES"] == "4096"
    error = journal.error_entry("disk_full", "no space", None)
    assert error["MESSAGE_ID"] == journal.MESSAGE_ID_ERROR and error["PRIORITY"] == "3"
    assert error["MESSAGE"] == "corehandler disk_full error: no space" and "COREHANDLER_ID" not in error


def test_a_record_missing_every_field_still_makes_an_entry():
    got = journal.dump_entry({}, {})
    assert got["COREHANDLER_OUTCOME"] == "unknown"
    assert "COREDUMP_PID" not in got and "COREDUMP_FILENAME" not in got


def test_an_adopted_orphan_says_what_is_unknown(tmp_path):
    """An orphan's record (spool.adopt_orphan) knows its pid and size only: the message says "unknown" for
    the rest, never Python's None."""
    from corehandler import spool

    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    dump_id = "1796000000000001-0123456789abcdef-4242"
    (spool_dir / f".tmp.{dump_id}.core").write_bytes(b"\x7fELF" + bytes(4092))
    [orphan] = spool.find_orphans(spool_dir, min_age=0)
    record = spool.adopt_orphan(spool_dir, orphan)
    got = journal.dump_entry(record, {"status": "orphan", "path": None})
    assert "None" not in got["MESSAGE"], got["MESSAGE"]
    assert got["MESSAGE"].startswith("Process 4242 (unknown) of user unknown dumped core on an unknown signal")
