"""Why a dump went up without its core (corehandler/fleet/withoutcore.py): the uploader's words for each case,
and what a reader makes of a sidecar of any shape, old or new."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from corehandler.fleet import withoutcore

STORM = {"capture": {"dropped": True, "dropped_reason": "max_per_exe_per_minute"}}


def dump(path="x.zst", status="ok", record=None, uid=1000, problem=None):
    return SimpleNamespace(path=path, status=status, record=record or {}, uid=uid, problem=problem)


@pytest.mark.parametrize("kw, at_upload, reason, words", [
    ({"send": "metadata"}, {}, "send_metadata", 'send = "metadata"'),
    ({}, {"budget": "kept_back"}, "fleet_budget", "at most 1 of them for one user of a host"),
    ({}, {"budget": "kept_back", "uid": 0}, "fleet_budget", "that root's crashes have"),
    ({}, {"path": None, "status": "dropped", "record": STORM}, "capture:max_per_exe_per_minute", "crash storm"),
    ({}, {"path": None, "status": "invalid", "problem": "not ET_CORE"}, "invalid", "(not ET_CORE)"),
    ({}, {"path": None, "status": "ok"}, "removed", "retention"),
])
def test_the_uploader_says_why(kw, at_upload, reason, words):
    budget = at_upload.pop("budget", None)
    said = withoutcore.at_upload(dump(**at_upload), send=kw.get("send", "cores"), budget=budget, fleet_budget=2,
                                 per_uid=1, signature="app SIGSEGV main", crash_day="2026-12-04")
    assert said["reason"] == reason and words in said["why"]
    if reason == "fleet_budget":
        assert "the fleet budget of signature 'app SIGSEGV main' on 2026-12-04 was spent" in said["why"]


@pytest.mark.parametrize("sc, reason", [
    ({"core": {"key": "k"}}, None),
    ({"core": None, "no_core": {"reason": "fleet_budget", "why": "spent"}}, "fleet_budget"),
    ({"core": None, "no_core": {"reason": "x" * 500, "why": ["not", "text"]}}, "x" * withoutcore.MAX_REASON),
    ({"core": None, "no_core": "spent", "budget": "kept_back"}, "fleet_budget"),
    ({"core": None, "index": {"status": "dropped"}, "record": STORM}, "capture:max_per_exe_per_minute"),
    ({"core": None, "index": {"status": "dropped"}, "record": {"capture": ["odd"]}}, "capture"),
    ({"core": None, "index": {"status": "dropped"}, "record": "odd"}, "capture"),
    ({"core": None, "index": ["odd"]}, "unknown"),
    ({"core": None}, "unknown"),
])
def test_a_reader_makes_words_of_any_sidecar(sc, reason):
    said = withoutcore.of_sidecar(sc)
    assert (said or {}).get("reason") == reason
    if said:
        assert isinstance(said["why"], str) and len(said["why"]) <= withoutcore.MAX_WHY


def test_labels_fit_a_table_cell():
    assert withoutcore.label("capture:max_pending") == "dropped: max_pending"
    assert withoutcore.label("fleet_budget") == "fleet budget" and withoutcore.label(None) == "sidecar only"
