"""JournalObserver against a real systemd-journald started by the test in a private mount namespace.

The observer runs in a namespace of its own where the private journald's socket directory is
/run/systemd/journal (support.journald.JournalClient), since journal.send always sends there.
"""

from __future__ import annotations

import subprocess

import pytest

from corehandler.observe import journal
from support.journald import PrivateJournald, expected_dump_fields, field_bytes, mismatches
from support.records import RecordMaker

pytestmark = [pytest.mark.root, pytest.mark.journald]

MIB = 1 << 20
DUMP = f"MESSAGE_ID={journal.MESSAGE_ID_COREDUMP}"
ERROR = f"MESSAGE_ID={journal.MESSAGE_ID_ERROR}"


@pytest.fixture
def journald(tmp_path):
    server = PrivateJournald(tmp_path / "journald")
    yield server
    server.close()


def test_every_dump_outcome_reaches_the_journal_with_its_fields(feeder, csplice, tmp_path, journald):
    journald.start()
    maker = RecordMaker(feeder, csplice, tmp_path / "csplice", max_dump_size=MIB)
    dumps = [maker.make(MIB // 2, signal=11),
             # A comm that is not UTF-8: the journal must keep the process's bytes.
             maker.make(2 * MIB, signal=6, comm=b"bad\xfe\xffname")]
    # csplice read /proc of this test's own pid: give the record the name /proc has for a process so named.
    dumps[1]["proc"]["comm"] = dumps[1]["comm"]
    maker.configure(max_pending=2)
    dumps.append(maker.make(MIB, signal=8))
    stored = [maker.store_dump(record) for record in dumps]
    client = journald.client()
    for record, s in zip(dumps, stored):
        client.call("on_ingested", record, s)
    assert client.close() == 0
    assert client.stderr() == ""  # nothing fell back

    entries = journald.wait_for(DUMP, count=3)
    assert len(entries) == 3
    by_id = {field_bytes(e, "COREHANDLER_ID").decode(): e for e in entries}
    for record, s in zip(dumps, stored):
        entry = by_id[record["id"]]
        assert mismatches(entry, expected_dump_fields(record, s)) == {}
        assert entry["_TRANSPORT"] == "journal"
        assert entry["MESSAGE_ID"] == journal.MESSAGE_ID_COREDUMP
    bad = by_id[dumps[1]["id"]]
    # The process's bytes, escaped in every field as in MESSAGE (printable.py); the record keeps them.
    assert field_bytes(bad, "COREDUMP_COMM") == b"bad\\xfe\\xffname"
    assert "(bad\\xfe\\xffname)" in bad["MESSAGE"]
    assert [field_bytes(by_id[r["id"]], "COREDUMP_SIGNAL_NAME") for r in dumps] == [b"SIGSEGV", b"SIGABRT",
                                                                                    b"SIGFPE"]
    assert field_bytes(by_id[dumps[2]["id"]], "COREHANDLER_DROPPED_REASON") == b"max_pending"
    # A journalctl user filtering by the MESSAGE_ID and the dump's id finds exactly that dump.
    assert len(journald.entries(DUMP, f"COREHANDLER_ID={dumps[0]['id']}")) == 1


def test_terminal_escapes_and_newlines_of_a_crash_reach_no_field_raw(feeder, csplice, tmp_path, journald):
    """A process names itself with ESC sequences and newlines (comm, exe, argv, a UTS namespace's host name):
    every field carries them escaped, and coredumpctl, which prints fields as they are, shows no raw escape."""
    journald.start()
    maker = RecordMaker(feeder, csplice, tmp_path / "csplice", max_dump_size=MIB)
    record = maker.make(MIB // 2, signal=11, comm=b"\x1b]0;own\x07x\ny")
    evil = "\x1b[2J\x1b]8;;http://x\x07"
    record["proc"].update(comm="\x1b[31mred\nline", exe=f"/tmp/{evil}\nMESSAGE=forged", cmdline=["a", f"b{evil}\nc"])
    record["hostname"] = f"h{evil}"
    stored = maker.store_dump(record)
    client = journald.client()
    client.call("on_ingested", record, stored)
    client.call("on_deleted", "1796000000000000-abc-42", record["proc"]["exe"], "max_age", MIB)
    assert client.close() == 0 and client.stderr() == ""

    (entry,) = journald.wait_for(DUMP)
    (deleted,) = journald.wait_for(f"MESSAGE_ID={journal.MESSAGE_ID_DELETED}")
    for e in (entry, deleted):
        for key, value in e.items():
            if key.startswith(("COREDUMP_", "COREHANDLER_")) and key != "COREHANDLER_STACK_TRACE":
                raw = field_bytes(e, key)
                assert not any(c < 0x20 or c == 0x7f for c in raw), (key, raw)
        assert "\x1b" not in e["MESSAGE"]
    assert field_bytes(entry, "COREDUMP_COMM") == b"\\x1b[31mred\\nline"
    assert field_bytes(entry, "COREDUMP_EXE") == b"/tmp/\\x1b[2J\\x1b]8;;http://x\\x07\\nMESSAGE=forged"
    assert field_bytes(entry, "COREDUMP_CMDLINE") == b"a 'b\\x1b[2J\\x1b]8;;http://x\\x07\\nc'"
    assert "MESSAGE=forged" not in entry["MESSAGE"] and entry.get("FORGED") is None
    assert field_bytes(deleted, "COREDUMP_EXE") == field_bytes(entry, "COREDUMP_EXE")
    shown = subprocess.run(["coredumpctl", f"--directory={journald.log_dir}", "--no-pager", "info"],
                           capture_output=True, timeout=60)
    assert b"red" in shown.stdout, shown
    assert b"\x1b[2J" not in shown.stdout and b"\x1b]" not in shown.stdout and b"\x1b[31m" not in shown.stdout


def test_deletions_and_errors_including_one_too_big_for_a_datagram(journald):
    journald.start()
    client = journald.client()
    client.call("on_deleted", "1796000000000000-abc-42", "/usr/bin/app", "max_use", 5 * MIB)
    huge = "traceback line\n" * 30000  # ~450 KB: sd_journal_sendv passes it in a sealed memfd
    client.call("on_error", "compress", huge, "1796000000000000-abc-43")
    assert client.close() == 0
    assert client.stderr() == ""

    (deleted,) = journald.wait_for(f"MESSAGE_ID={journal.MESSAGE_ID_DELETED}")
    assert deleted["COREHANDLER_RULE"] == "max_use"
    assert deleted["COREHANDLER_FREED_BYTES"] == str(5 * MIB)
    assert deleted["COREDUMP_EXE"] == "/usr/bin/app"
    assert deleted["PRIORITY"] == "6"
    (error,) = journald.wait_for(ERROR)
    assert error["PRIORITY"] == "3"
    assert error["COREHANDLER_ERROR_KIND"] == "compress"
    assert error["COREHANDLER_ID"] == "1796000000000000-abc-43"
    assert error["MESSAGE"].endswith(huge)


def test_stale_socket_falls_back_to_stderr_then_recovers(journald):
    journald.start()
    client = journald.client(retry_seconds=0)
    assert client.call("send", {"MESSAGE": "probe"}) is True
    client.call("on_error", "ingest", "before the crash", None)
    journald.wait_for(ERROR)

    journald.stop()
    assert journald.socket_path.exists()  # stale: nobody listens
    client.call("on_error", "ingest", "while journald\nis down", None)  # must not raise
    first, second = client.stderr().splitlines()
    assert "journald unavailable at /run/systemd/journal/socket (Connection refused)" in first
    assert second.startswith("<3>corehandler ingest error: while journald\\nis down {")
    assert '"COREHANDLER_ERROR_KIND": "ingest"' in second

    journald.start()
    client.call("on_error", "ingest", "after the restart", None)
    assert client.stderr().splitlines()[-1] == "<3>corehandler: journald is back"
    assert client.close() == 0
    messages = [e["MESSAGE"] for e in journald.wait_for(ERROR, count=2)]
    assert "corehandler ingest error: before the crash" in messages
    # What went to stderr while journald was down is not replayed into the journal later.
    assert "corehandler ingest error: after the restart" in messages
    assert not any("is down" in m for m in messages)


def test_stuck_journald_does_not_hold_up_the_daemon(journald):
    journald.start()
    client = journald.client(retry_seconds=0, send_timeout=0.5)
    journald.pause()
    try:
        # The socket queues a few datagrams (net.unix.max_dgram_qlen), then journal.send would block.
        sent = 0
        while client.call("send", {"MESSAGE": "queued", "N": str(sent)}) is True:
            sent += 1
            assert sent < 1000, "journald's socket never filled up"
        assert "journald unavailable at /run/systemd/journal/socket (journald took no entry in 0.5 s)" in \
            client.stderr()
        client.call("on_error", "ingest", "while stuck", None)
        assert client.stderr().splitlines()[-1].startswith("<3>corehandler ingest error: while stuck {")
    finally:
        journald.resume()
    assert client.call("send", {"MESSAGE": "after", "X": "3"}) is True
    assert client.stderr().splitlines()[-1] == "<3>corehandler: journald is back"
    assert client.close() == 0
    assert journald.wait_for("X=3")[0]["MESSAGE"] == "after"
    assert len(journald.entries("MESSAGE=queued")) == sent
    assert not any("while stuck" in e["MESSAGE"] for e in journald.entries(ERROR))


def test_absent_journald_falls_back_to_stderr_and_is_retried_after_the_interval(journald):
    # journal.send drops entries silently when the socket does not exist; the observer must not.
    waiting = journald.client(retry_seconds=3600)
    retrying = journald.client(retry_seconds=0)
    for client in (waiting, retrying):
        client.call("on_deleted", "dump-1", "/usr/bin/x", "max_age", 4096)
        first, second = client.stderr().splitlines()
        assert "journald unavailable at /run/systemd/journal/socket (No such file or directory)" in first
        assert second.startswith("<6>Removed dump dump-1 (/usr/bin/x) by retention rule max_age")
        assert '"COREHANDLER_RULE": "max_age"' in second

    journald.start()
    # Within its retry interval journald is not tried, even though it is back; after it, it is.
    assert waiting.call("send", {"MESSAGE": "early", "X": "1"}) is False
    assert waiting.stderr().splitlines()[-1] == '<6>early {"X": "1"}'
    assert retrying.call("send", {"MESSAGE": "late", "X": "2"}) is True
    assert retrying.stderr().splitlines()[-1] == "<3>corehandler: journald is back"
    assert waiting.close() == retrying.close() == 0
    (late,) = journald.wait_for("X=2")
    assert late["MESSAGE"] == "late"
    assert journald.entries("X=1") == [] and journald.entries("COREHANDLER_RULE=max_age") == []


def test_nothing_raises_when_stderr_is_gone_too(journald):
    client = journald.client()
    client.call("close_stderr")
    client.call("on_ingested", {}, {})
    client.call("on_ingested", None, None)
    client.call("on_error", "ingest", "nowhere to go", None)
    client.call("on_state", 1, 2, 3)
    client.call("close")
    assert client.close() == 0
