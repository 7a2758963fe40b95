"""What the daemon's re-symbolising keeps of a result analysed again (corehandler/analysis/resymbolise.py), on a
real index: never fewer names than before, never another exact key, and the schedule's row gone once nothing
is lacking. (The schedule itself, with the real debuginfod and eu-stack: tests/local/test_debuginfod.py.)"""

from __future__ import annotations

import pytest

from corehandler.analysis import resymbolise, symbols
from corehandler.store import analyses
from corehandler.store.dumprow import row_from_record
from corehandler.store.index import Store

DUMP = "1796000000000001-0123456789abcdef-1"
EXE = "ab" * 20


def _result(functions, exact="x1-first", exe_symbols=symbols.NONE):
    return {"state": "ok", "exact_key": exact, "exact_version": 1, "problems": [],
            "threads": [{"tid": 1, "frames": [{"index": i, "function": f, "build_id": EXE, "offset": 16 * i}
                                              for i, f in enumerate(functions)]}],
            "modules": [{"name": "/usr/bin/app", "build_id": EXE, "symbols": exe_symbols}]}


@pytest.fixture
def store(tmp_path):
    record = {"schema": 1, "id": DUMP, "core": None, "pid": 1, "uid": 0, "gid": 0, "signal": 11,
              "timestamp": 1_700_000_000, "comm": "app", "hostname": "h", "boot_id": "0" * 32,
              "proc": {"exe": "/usr/bin/app", "cmdline": ["/usr/bin/app"]}}
    with Store(tmp_path / "state") as s:
        s.insert(row_from_record(record, status="ok", problem=None, path=None, raw_bytes=0, stored_bytes=0,
                                 sha256=None))
        analyses.put(s, DUMP, _result([None, None, "main"]))
        with s.db:
            s.db.execute("INSERT INTO resymbolise (id, tries, due) VALUES (?, 1, 0)", (DUMP,))
        yield s


def _stored(store):
    return analyses.analysis_for(store, DUMP)


def test_a_result_naming_no_more_frames_is_not_kept(store):
    again = resymbolise.Resymboliser(lambda: None, lambda uids: None)
    again._store(store, DUMP, _result([None, None, None], exact="x1-other"))  # a mini-core unwind cut short
    assert [f["function"] for f in _stored(store)["threads"][0]["frames"]] == [None, None, "main"]
    assert "resymbolised_at" not in _stored(store)


def test_names_replace_offsets_and_the_first_exact_key_stays(store):
    again = resymbolise.Resymboliser(lambda: None, lambda uids: None)
    again._store(store, DUMP, _result(["crash", "run", "main"], exact="x1-other", exe_symbols=symbols.DEBUGINFOD))
    kept = _stored(store)
    assert [f["function"] for f in kept["threads"][0]["frames"]] == ["crash", "run", "main"]
    assert kept["exact_key"] == "x1-first" and kept["resymbolised_at"] > 0
    assert any("x1-other" in p and "x1-first" in p for p in kept["problems"])
    assert store.db.execute("SELECT COUNT(*) FROM resymbolise").fetchone() == (0,)  # nothing lacking any more
