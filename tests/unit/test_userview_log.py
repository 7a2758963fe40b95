"""A user's view as a log (userview.py, schema 2): replayed by id, deletions applied, a line a writer left cut
short skipped; a view an older daemon wrote whole (schema 1) still reads."""

from __future__ import annotations

import json

from corehandler.store.userview import _line, _replay


def row(i: str, t: float) -> dict:
    return {"id": i, "crashed_at": t}


def test_the_log_replays_to_the_last_line_of_each_id():
    raw = (_line({"schema": 2, "uid": 1, "compacted_bytes": 0})
           + _line({"dump": row("b", 2), "analysis": None, "summary": None})
           + _line({"dump": row("a", 1), "analysis": {"state": "ok"}, "summary": {"signature": "s"}})
           + _line({"dump": row("c", 3), "analysis": None, "summary": None})
           + _line({"gone": "c"})
           + _line({"dump": row("b", 2), "analysis": {"state": "partial"}, "summary": None})
           + _line({"dump": row("d", 4), "analysis": None, "summary": None})[:20])  # cut short mid-append
    rows, found, summaries = _replay(raw)
    assert [r["id"] for r in rows] == ["a", "b"]
    assert found == {"a": {"state": "ok"}, "b": {"state": "partial"}} and summaries == {"a": {"signature": "s"}}


def test_a_view_written_whole_by_an_older_daemon_reads():
    old = {"schema": 1, "uid": 1, "dumps": [row("a", 1)], "analysis": {"a": {"state": "ok"}},
           "analysis_summaries": {}}
    assert _replay(json.dumps(old).encode()) == ([row("a", 1)], {"a": {"state": "ok"}}, {})
    assert _replay(b"{}") == ([], {}, {}) and _replay(b"") == ([], {}, {})
