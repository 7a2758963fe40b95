"""JournalObserver against a real systemd-journald started by the test in a private mount namespace."""

from __future__ import annotations

import io

import pytest

from corehandler import journal
from corehandler.journal import JournalObserver
from support.journald import PrivateJournald, expected_dump_fields, field_bytes, mismatches
from support.records import RecordMaker

pytestmark = [pytest.mark.root, pytest.mark.journald]

MIB = 1 << 20
DUMP = f"MESSAGE_ID={journal.MESSAGE_ID_DUMP}"


@pytest.fixture
def journald(tmp_path):
    server = PrivateJournald(tmp_path / "journald")
    server.start()
    yield server
    server.stop()


def test_every_dump_outcome_reaches_the_journal_with_its_fields(feeder, csplice, tmp_path, journald):
    maker = RecordMaker(feeder, csplice, tmp_path / "csplice", max_dump_bytes=MIB)
    dumps = [maker.make(MIB // 2, signal=11),
             # A comm that is not UTF-8: the journal must keep the process's bytes.
             maker.make(2 * MIB, signal=6, comm=b"bad\xfe\xffname")]
    maker.configure(max_pending=2)
    dumps.append(maker.make(MIB, signal=8))
    observer = JournalObserver(journald.socket_path)
    stored = [maker.store_dump(record) for record in dumps]
    for record, s in zip(dumps, stored):
        observer.on_ingested(record, s)
    observer.close()

    entries = journald.wait_for(DUMP, count=3)
    assert len(entries) == 3
    by_id = {field_bytes(e, "COREHANDLER_ID").decode(): e for e in entries}
    for record, s in zip(dumps, stored):
        entry = by_id[record["id"]]
        assert mismatches(entry, expected_dump_fields(record, s)) == {}
        assert entry["_TRANSPORT"] == "journal"
    assert field_bytes(by_id[dumps[1]["id"]], "COREDUMP_COMM") == b"bad\xfe\xffname"
    assert [field_bytes(by_id[r["id"]], "COREDUMP_SIGNAL_NAME") for r in dumps] == [b"SIGSEGV", b"SIGABRT",
                                                                                    b"SIGFPE"]
    assert field_bytes(by_id[dumps[2]["id"]], "COREHANDLER_DROPPED_REASON") == b"max_pending"
    # A journalctl user filtering by the MESSAGE_ID and the dump's id finds exactly that dump.
    assert len(journald.entries(DUMP, f"COREHANDLER_ID={dumps[0]['id']}")) == 1


def test_deletions_and_errors_including_one_too_big_for_a_datagram(journald):
    observer = JournalObserver(journald.socket_path)
    observer.on_deleted("1796000000000000-abc-42", "/usr/bin/app", "max_use", 5 * MIB)
    huge = "traceback line\n" * 30000  # ~450 KB: sent in a sealed memfd
    observer.on_error("compress", huge, "1796000000000000-abc-43")
    observer.close()

    (deleted,) = journald.wait_for(f"MESSAGE_ID={journal.MESSAGE_ID_DELETED}")
    assert deleted["COREHANDLER_RULE"] == "max_use"
    assert deleted["COREHANDLER_FREED_BYTES"] == str(5 * MIB)
    assert deleted["COREDUMP_EXE"] == "/usr/bin/app"
    assert deleted["PRIORITY"] == "6"
    (error,) = journald.wait_for(f"MESSAGE_ID={journal.MESSAGE_ID_ERROR}")
    assert error["PRIORITY"] == "3"
    assert error["COREHANDLER_ERROR_KIND"] == "compress"
    assert error["COREHANDLER_ID"] == "1796000000000000-abc-43"
    assert error["MESSAGE"].endswith(huge)


def test_stale_socket_falls_back_to_stderr_then_recovers(journald):
    err = io.StringIO()
    observer = JournalObserver(journald.socket_path, retry_seconds=0, stderr=err)
    observer.on_error("ingest", "before the crash", None)
    journald.wait_for(f"MESSAGE_ID={journal.MESSAGE_ID_ERROR}")

    journald.stop()
    assert journald.socket_path.exists()  # stale: nobody listens
    observer.on_error("ingest", "while journald is down", None)  # must not raise
    assert "Connection refused" in err.getvalue()
    assert "<3>corehandler ingest error: while journald is down {" in err.getvalue()

    journald.start()
    observer.on_error("ingest", "after the restart", None)
    assert "is back" in err.getvalue().splitlines()[-1]
    messages = [e["MESSAGE"] for e in journald.wait_for(f"MESSAGE_ID={journal.MESSAGE_ID_ERROR}", count=2)]
    assert "corehandler ingest error: before the crash" in messages
    # What went to stderr while journald was down is not replayed into the journal later.
    assert "corehandler ingest error: after the restart" in messages
    assert not any("while journald is down" in m for m in messages)
