"""host/writerates.py: the choice of csplice's direct_above from the spool's measured write rates, its
rendering into csplice.conf, and when a saved measurement no longer speaks for the machine."""

from __future__ import annotations

import dataclasses

import pytest

from corehandler import config, csplice_contract
from corehandler.host import handler, writerates
from corehandler.host.writerates import Measurement, MiB
from corehandler.paths import Host, Paths


@pytest.fixture
def proc(tmp_path):
    return tmp_path / "proc"


@pytest.fixture
def paths(tmp_path, proc) -> Paths:
    (proc / "sys" / "vm").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal:       25000000 kB\nMemAvailable:   20000000 kB\n")
    (proc / "sys" / "vm" / "dirty_bytes").write_text("0\n")
    (proc / "sys" / "vm" / "dirty_ratio").write_text("20\n")
    p = Paths(state_dir=tmp_path / "state")
    p.spool_dir.mkdir(parents=True)
    return p


def proc_of(paths: Paths):
    return paths.state_dir.parent / "proc"


def measured(paths: Paths, buffered: float, direct: float | None, **kw) -> Measurement:
    proc = proc_of(paths)
    return Measurement(buffered_bps=buffered * MiB, direct_bps=direct and direct * MiB,
                       dirty_limit_bytes=writerates.dirty_limit(proc), host=writerates.host_signature(paths, proc),
                       measured_at=kw.pop("measured_at", 1e9), rounds=3, probe_bytes=64 * MiB, **kw)


def rendered(paths: Paths, capture: dict | None = None, key: str = "direct_above") -> int:
    cfg = config.Config.model_validate({"capture": capture or {}})
    facts = handler.facts(Host(proc_root=proc_of(paths)), paths)
    return int(csplice_contract.settings_values(cfg.capture, paths.spool_dir, facts)[key])


# 20% of MemAvailable (20000000 kB), rounded down to whole MiB.
DIRTY_LIMIT = 20000000 * 1024 * 20 // 100 // MiB * MiB


def test_o_direct_faster_at_the_probe_still_starts_buffered_and_moves_at_its_rate(paths):
    """These VMs: the probe saw O_DIRECT several times the rate of fresh page cache, but a dump may get recycled
    pages: csplice starts buffered and moves to direct when its own dump is slower than O_DIRECT's 1400 MiB/s."""
    choice = writerates.choose(measured(paths, 320, 1400))
    assert (choice.direct_above, choice.direct_rate) == (DIRTY_LIMIT, 1400 * MiB)
    assert "O_DIRECT 1400 MiB/s, page cache 320 MiB/s" in choice.reason


def test_the_probes_buffered_rate_decides_nothing(paths):
    """It is the moment's (fresh or recycled pages): 2026-12-03's run measured the page cache faster, and then
    held 1 GiB 2.4x the floor through it (bench/results/capture.md)."""
    choices = [writerates.choose(measured(paths, buffered, 950)) for buffered in (100, 1000, 5000)]
    assert {(c.direct_above, c.direct_rate) for c in choices} == {(DIRTY_LIMIT, 950 * MiB)}


def test_page_cache_faster_means_direct_from_the_start_only_past_the_dirty_limit(paths):
    """Bare metal with a slow disk: buffered writes win until they wait for writeback, and a dump that the page
    cache takes at memory speed never falls below 3/4 of the disk's rate."""
    choice = writerates.choose(measured(paths, 3000, 200))
    assert (choice.direct_above, choice.direct_rate) == (DIRTY_LIMIT, 200 * MiB)
    assert "dirty limit" in choice.reason


def test_dirty_bytes_wins_over_dirty_ratio(paths):
    (proc_of(paths) / "sys" / "vm" / "dirty_bytes").write_text(str(600 * MiB + 5))
    assert writerates.dirty_limit(proc_of(paths)) == 600 * MiB + 5
    assert writerates.choose(measured(paths, 3000, 200)).direct_above == 600 * MiB


def test_no_o_direct_means_never_direct(paths):
    choice = writerates.choose(measured(paths, 300, None, note="the filesystem refuses O_DIRECT"))
    assert (choice.direct_above, choice.direct_rate) == (0, 0) and "refuses O_DIRECT" in choice.reason


def test_unmeasured_keeps_the_built_in_default_of_csplice(paths):
    choice = writerates.choose(None)
    assert choice.direct_above == writerates.UNMEASURED_DIRECT_ABOVE == 2 << 30 and choice.direct_rate == 0
    assert "not measured" in choice.reason


def test_the_saved_measurement_is_rendered_into_csplice_conf(paths):
    assert rendered(paths) == 2 << 30  # nothing saved yet
    writerates.save(paths, measured(paths, 320, 1400))
    assert writerates.load(paths) == measured(paths, 320, 1400)
    assert (rendered(paths), rendered(paths, key="direct_rate")) == (DIRTY_LIMIT, 1400 * MiB)
    # An explicit size or rate is the operator's; an explicit strategy is used for every dump, whole.
    assert rendered(paths, {"direct_above": "1G"}) == 1 << 30
    assert rendered(paths, {"direct_rate": "0"}, key="direct_rate") == 0
    assert rendered(paths, {"direct_rate": "500M"}, key="direct_rate") == 500 * MiB
    assert rendered(paths, {"strategy": "rw"}) == rendered(paths, {"strategy": "rw"}, key="direct_rate") == 0


def test_an_unreadable_measurement_is_none(paths):
    paths.capture_rates.write_text("{not json")
    assert writerates.load(paths) is None
    paths.capture_rates.write_text('{"buffered_bps": 1}')
    assert writerates.load(paths) is None
    assert rendered(paths) == 2 << 30


def test_a_measurement_is_current_on_the_same_machine_for_max_age(paths):
    m = measured(paths, 320, 1400, measured_at=1e9)
    assert writerates.is_current(m, paths, now=1e9 + writerates.MAX_AGE - 1, proc_root=proc_of(paths))
    assert not writerates.is_current(m, paths, now=1e9 + writerates.MAX_AGE + 1, proc_root=proc_of(paths))
    # the clock went back: measure again
    assert not writerates.is_current(m, paths, now=1e9 - 60, proc_root=proc_of(paths))
    assert not writerates.is_current(None, paths, proc_root=proc_of(paths))
    for key, value in (("kernel", "0.0.0"), ("mem_total", 1), ("spool_dev", -1)):
        moved = dataclasses.replace(m, host={**m.host, key: value})
        assert not writerates.is_current(moved, paths, now=1e9, proc_root=proc_of(paths)), key


def test_refresh_measures_only_when_the_saved_one_is_not_current(paths, monkeypatch):
    calls = []
    monkeypatch.setattr(writerates, "measure", lambda p, **kw: calls.append(p) or measured(p, 320, 1400))
    monkeypatch.setattr(writerates, "is_current", lambda m, p, **kw: m is not None)
    first, problem = writerates.refresh(paths)
    assert problem is None and calls == [paths] and writerates.load(paths) == first
    again, _ = writerates.refresh(paths)
    assert again == first and len(calls) == 1
    writerates.refresh(paths, force=True)
    assert len(calls) == 2


def test_a_failed_measurement_keeps_the_old_one_and_says_why(paths, monkeypatch):
    old = measured(paths, 320, 1400)
    writerates.save(paths, old)

    def fail(p, **kw):
        raise OSError("less than 5 GiB free")

    monkeypatch.setattr(writerates, "measure", fail)
    found, problem = writerates.refresh(paths, force=True)
    assert found == old and "less than 5 GiB free" in problem


def test_the_daemon_renders_only_after_a_new_measurement(paths, monkeypatch):
    """serve's start: measured in a thread of its own, csplice.conf re-rendered (then) only when a measurement
    was taken."""
    rendered = []
    monkeypatch.setattr(writerates, "measure", lambda p, **kw: measured(p, 320, 1400))
    writerates.refresh_in_background(paths, lambda: rendered.append(writerates.load(paths))).join(10)
    assert rendered == [measured(paths, 320, 1400)]
    monkeypatch.setattr(writerates, "is_current", lambda m, p, **kw: True)
    writerates.refresh_in_background(paths, lambda: rendered.append("again")).join(10)
    assert len(rendered) == 1
