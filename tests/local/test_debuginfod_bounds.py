"""The debuginfod fetcher's bounds (corehandler/analysis/debuginfod.py) against a real server on loopback that sends
a byte a second (tests/support/debuginfod_server.py `dripping`): a deadline per request and per dump that no trickle
defeats; a few build-ids fetched at once, and a stuck server (`slow`) costing its timeout once a pass; no temp file
left behind, stale ones and old negative results swept, the cache's directories not listable by other users, plain
http refused off loopback."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

from corehandler.analysis import debuginfod
from corehandler.config import AnalysisConfig
from support import debuginfod_server

ELF = b"\x7fELF" + bytes(60)
IDS = ["ab" + "0" * 38, "cd" + "1" * 38]


def fetch_within(settings, cache, build_ids, limit: float):
    """fetch() in a thread; (its report, seconds) or a failure when it is not back within limit seconds."""
    out = {}

    def run():
        started = time.monotonic()
        out["report"] = debuginfod.fetch(settings, cache, build_ids)
        out["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"fetch still running after {limit} s: the deadline did not hold"
    return out["report"], out["seconds"]


def leftovers(cache):
    return sorted(p.name for p in cache.rglob(".tmp.*"))


@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "headers"])
def test_a_dripping_server_is_cut_at_the_request_deadline(tmp_path, headers_too):
    cache = tmp_path / "debuginfo"
    with debuginfod_server.dripping(ELF, headers_too=headers_too) as url:
        settings = debuginfod.Settings(urls=(url,), timeout=3, budget=30)
        report, seconds = fetch_within(settings, cache, IDS[:1], limit=10)
    assert 2.5 < seconds < 5, seconds
    assert report.fetched == [] and len(report.failed) == 1 and "not done in 3 s" in report.failed[0], report
    assert not debuginfod.cached(cache, IDS[0]).exists()
    assert leftovers(cache) == []


def test_the_budget_bounds_a_whole_dump(tmp_path):
    cache = tmp_path / "debuginfo"
    with debuginfod_server.dripping(ELF) as url:
        settings = debuginfod.Settings(urls=(url,), timeout=10, budget=3)
        report, seconds = fetch_within(settings, cache, IDS, limit=10)
    assert seconds < 5, seconds
    assert report.fetched == [] and report.cut and leftovers(cache) == []


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_tidy_sweeps_stale_temp_files_and_negatives_and_fixes_modes(tmp_path, monkeypatch):
    cache = tmp_path / "debuginfo"
    sub = cache / ".build-id" / "ab"
    sub.mkdir(parents=True)
    for d in (cache, cache / ".build-id", sub):
        os.chmod(d, 0o755)  # what an older version made
    stale, live = sub / f".tmp.x.debug.{dead_pid()}", sub / f".tmp.y.debug.{os.getpid()}"
    stale.write_bytes(b"half")
    live.write_bytes(b"being written")
    negatives = cache / ".negative"
    negatives.mkdir(mode=0o755)
    old = negatives / ("ee" * 20)
    old.touch()
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    monkeypatch.setattr(debuginfod, "NEGATIVE_MAX", 3)
    for i in range(5):
        fresh = negatives / f"{i:040x}"
        fresh.touch()
        os.utime(fresh, (time.time() - 10 * i, time.time() - 10 * i))

    debuginfod.fetch(debuginfod.Settings(urls=(), negative_ttl=3600), cache, [])

    assert not stale.exists() and live.exists()
    assert sorted(p.name for p in negatives.iterdir()) == [f"{i:040x}" for i in range(3)]
    for d in (cache, cache / ".build-id", sub):  # crossable by each analysis's own uid, listable by none
        assert d.stat().st_mode & 0o777 == 0o711, d
    assert negatives.stat().st_mode & 0o777 == 0o700


def test_plain_http_is_refused_off_loopback():
    text = "http://debuginfod.example.com https://debuginfod.debian.net http://127.0.0.1:8002 http://[::1]:80 ftp://x"
    assert debuginfod.urls(text) == ("https://debuginfod.debian.net", "http://127.0.0.1:8002", "http://[::1]:80")
    assert debuginfod.urls("", {"DEBUGINFOD_URLS": "http://10.0.0.1"}) == ()
    assert debuginfod.urls("http://debuginfod.example.com/", allow_http=True) == ("http://debuginfod.example.com",)
    with pytest.raises(ValueError, match="plain http is allowed only on loopback"):
        AnalysisConfig.model_validate({"debuginfod_urls": "http://debuginfod.example.com"})
    assert AnalysisConfig.model_validate({"debuginfod_urls": "http://debuginfod.example.com",
                                          "debuginfod_allow_http": True}).debuginfod_allow_http


MANY = [f"{i:02x}" + "2" * 38 for i in range(10)]


def test_fetches_run_a_few_at_once(tmp_path):
    cache = tmp_path / "debuginfo"
    with debuginfod_server.slow(ELF, delay=1.0) as (url, seen):
        settings = debuginfod.Settings(urls=(url,), timeout=10, budget=60)
        report, seconds = fetch_within(settings, cache, MANY, limit=20)
    assert report.fetched == MANY and not report.failed and not report.cut, report
    assert seen.requests == len(MANY)
    assert seen.most_at_once == debuginfod.POOL  # concurrent, and bounded
    # ceil(10 / 4) waves of 1 s, where one at a time took 10 s
    assert 2.9 < seconds < 6, seconds
    assert all(debuginfod.cached(cache, b).read_bytes() == ELF for b in MANY)


def test_a_stuck_server_costs_its_timeout_once_per_pass(tmp_path):
    cache = tmp_path / "debuginfo"
    with debuginfod_server.slow(None, delay=0) as (url, seen):
        settings = debuginfod.Settings(urls=(url,), timeout=2, budget=60)
        report, seconds = fetch_within(settings, cache, MANY, limit=20)
        asked = seen.requests
    assert seconds < 3.5, seconds  # one timeout, not ten
    assert asked <= debuginfod.POOL, asked  # the ones in flight when it was found stuck, and no more
    assert report.fetched == [] and report.missing == [] and not report.cut, report
    assert len(report.failed) == len(MANY)
    skipped = [why for why in report.failed if "not asked, it did not answer in this pass" in why]
    assert len(skipped) == len(MANY) - asked and all("not done in 2 s" in why for why in report.failed)
    assert leftovers(cache) == [] and not (cache / ".negative").exists()  # down is no "missing"

    # The next pass asks it again (a server that was down may be back).
    with debuginfod_server.slow(ELF, delay=0) as (url2, _):
        report = debuginfod.fetch(debuginfod.Settings(urls=(url2,), timeout=2), cache, MANY[:1])
    assert report.fetched == MANY[:1]


def test_past_a_stuck_server_the_next_one_serves(tmp_path):
    cache = tmp_path / "debuginfo"
    with debuginfod_server.slow(None, delay=0) as (stuck, _), debuginfod_server.slow(ELF, delay=0) as (good, seen):
        settings = debuginfod.Settings(urls=(stuck, good), timeout=2, budget=60)
        report, seconds = fetch_within(settings, cache, MANY, limit=20)
    assert report.fetched == MANY and not report.failed, report
    assert seen.requests == len(MANY)
    assert seconds < 3.5, seconds
