"""The words csplice and the control plane share, each spelled once per side: csplice prints its tables
(--list-specifiers, --list-strategies, --list-settings) and they must be the Python side's, in the same order.
Adding a setting is a line in csplice's setting_table and a field in config.CaptureConfig; this test says when
one side has it and the other does not."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from corehandler import config, csplice_contract
from corehandler.analysis import identity
from corehandler.host import handler as host_handler
from corehandler.paths import Host, Paths
from support.csplice_harness import Handler


def listed(csplice, option: str) -> list[str]:
    out = subprocess.run([str(csplice), option], capture_output=True, text=True, check=True, timeout=10)
    return out.stdout.splitlines()


def test_specifiers_are_the_ones_install_puts_in_core_pattern(csplice):
    want = f"{csplice_contract.SPECIFIERS} [{csplice_contract.PIDFD_SPECIFIER}]"
    assert listed(csplice, "--list-specifiers") == [want]


def test_strategies_are_the_ones_the_config_accepts(csplice):
    assert tuple(listed(csplice, "--list-strategies")) == csplice_contract.STRATEGIES
    config.Config.model_validate({"capture": {"strategy": csplice_contract.STRATEGIES[-1]}})


def test_annotations_are_the_ones_identity_reads(csplice):
    """csplice keeps exactly the bundle annotations identity names a pod and a container by, nothing else."""
    assert listed(csplice, "--list-annotations") == [n for names in identity.ANNOTATIONS.values() for n in names]


def test_settings_are_the_capture_section_with_the_same_defaults(csplice, tmp_path):
    """Every key csplice reads is one corehandler writes, under the same name, and csplice's built-in defaults
    (what it uses without a file) are the config's defaults as rendered on a stock kernel."""
    in_c = dict(line.split("=", 1) for line in listed(csplice, "--list-settings"))
    # No kallsyms: stock; no measured write rates in this state dir: direct_above unmeasured.
    facts = host_handler.facts(Host(proc_root=tmp_path), Paths(state_dir=tmp_path))
    in_python = csplice_contract.settings_values(config.CaptureConfig(), Paths().spool_dir, facts)
    assert list(in_c) == list(in_python)
    assert in_c == in_python
    assert list(in_python)[1:] == list(config.CaptureConfig.model_fields)


def test_the_rendered_file_is_read_back_as_written(csplice, tmp_path):
    """Non-default values of every type (size, percent, duration, boolean, strategy) reach csplice unchanged,
    the owner's keys beside them (which csplice ignores): the record lists the settings csplice ran with."""
    cfg = config.Config.model_validate({"capture": {
        "strategy": "splice", "chunk_size": "128K", "pipe_size": 0, "max_dump_size": "5M", "min_free": "1%",
        "max_pending": 0, "max_pending_per_uid": 3, "max_per_exe_per_minute": 0, "timeout": "90s", "fsync": True,
        "sparse": False, "io_realtime": True}})
    handler = Handler(tmp_path / "h")
    text = host_handler.settings_for(cfg.capture, Paths(state_dir=tmp_path / "h"), Host(proc_root=tmp_path))
    assert "\nowner=" in text
    handler.settings_path.write_text(text)
    settings = handler.feed(4096).record["handler"]["settings"]
    assert settings["error"] is None and settings["from_file"]
    assert {k: settings[k] for k in config.CaptureConfig.model_fields} == {
        "strategy": "splice", "chunk_size": 128 << 10, "pipe_size": 0, "max_dump_size": 5 << 20, "direct_above": 0,
        "direct_rate": 0,
        "min_free": "1%", "max_pending": 0, "max_pending_per_uid": 3, "max_per_exe_per_minute": 0, "timeout": 90,
        "fsync": True, "sparse": False, "io_realtime": True,
        "collect_environ": False, "collect_maps": False}


# The words of docs/design.md's "Words" table: one name per quantity from csplice to the metrics. These are
# the names each quantity had before, which must not come back in either language.
RETIRED = ("captured_bytes", "compressed_bytes", "CAPTURED_BYTES", "COMPRESSED_BYTES", "->written", ".written",
           "metadata_only")
# The one place a retired word may stand: the index migration that turns old rows into the new word.
MIGRATION = "UPDATE dumps SET status = 'dropped' WHERE status = 'metadata_only'"


def test_a_real_record_the_index_row_and_the_event_carry_the_quantities_by_their_one_name(csplice, tmp_path):
    from corehandler.observer import Stored
    from corehandler.store.dumprow import STATUSES, Dump

    cap = Handler(tmp_path / "h").feed(8192).record["capture"]
    assert cap["bytes"] == 8192 and cap["drained_bytes"] == 0  # the record's capture section: raw and drained
    for kind in (Dump, Stored):
        assert {"raw_bytes", "stored_bytes"} <= {f.name for f in dataclasses.fields(kind)}, kind
    assert "dropped" in STATUSES


@pytest.mark.parametrize("strategy", ["rw", "direct", "splice2"])
def test_a_real_record_traces_the_hold_by_the_phase_names(csplice, tmp_path, strategy):
    """capture.phases has csplice_contract.PHASES, in set-up order, each copy step inside the hold, and the two
    longest calls (record_schema checks the shape; this, that the steps were really timed)."""
    from support.record_schema import check_record

    record = Handler(tmp_path / "h", settings={"strategy": strategy, "direct_above": 0}).feed(8 << 20).record
    check_record(record)
    cap = record["capture"]
    assert list(cap["phases"]) == list(csplice_contract.PHASES)
    ph = cap["phases"]
    assert ph["first_byte"] > 0 and ph["eof"] >= ph["first_byte"] and ph["published"] >= ph["released"] > 0
    assert (ph["ring"] > 0) == (cap["strategy"] == "direct") and ph["handoff"] == 0  # direct: unless refused
    assert 0 < cap["longest_read_ns"] <= ph["released"] and 0 < cap["longest_write_ns"] <= ph["released"]
    # The hold as the record already had it: the copy's steps fall inside it.
    assert cap["ns"] <= ph["released"] - ph["created"] + 1_000_000


def test_no_retired_quantity_name_is_left_in_the_sources():
    root = Path(__file__).resolve().parents[2]
    sources = [*root.joinpath("corehandler").rglob("*.py"), *root.joinpath("csplice").glob("*.[ch]"),
               root / "packaging" / "grafana" / "corehandler-dashboard.json", root / "docs" / "observability.md"]
    found = [f"{path.relative_to(root)}: {word}" for path in sources
             for word in RETIRED if word in path.read_text().replace(MIGRATION, "")]
    assert found == []
