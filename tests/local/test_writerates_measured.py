"""The spool's write rates measured for real (host/writerates.py), on this machine's filesystem and on one
without direct I/O, and `doctor` reporting what was measured and chosen."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from corehandler.cli import main
from corehandler.host import writerates
from corehandler.paths import Paths

MiB = 1 << 20


def state(root) -> Paths:
    paths = Paths(state_dir=root)
    paths.spool_dir.mkdir(parents=True)
    return paths


def test_measure_writes_both_ways_and_leaves_nothing(tmp_path):
    paths = state(tmp_path / "state")
    m = writerates.measure(paths, probe_bytes=16 * MiB, rounds=2)
    assert m.buffered_bps > 0 and m.direct_bps and m.direct_bps > 0, m
    assert m.rounds == 2 and m.probe_bytes == 16 * MiB and m.note == ""
    assert m.host == writerates.host_signature(paths) and writerates.is_current(m, paths)
    assert m.dirty_limit_bytes > 0
    assert os.listdir(paths.spool_dir) == []  # the probe files were unlinked as soon as opened


def test_refresh_saves_what_install_and_the_daemon_render(tmp_path):
    paths = state(tmp_path / "state")
    found, problem = writerates.refresh(paths)
    assert problem is None and writerates.load(paths) == found
    assert writerates.refresh(paths) == (found, None)  # current: not measured again


@pytest.mark.root
def test_a_filesystem_without_o_direct_means_never_direct(tmp_path):
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "-o", "mode=0700", "ramfs", str(mnt)], check=True)
    try:
        paths = state(mnt / "state")
        m = writerates.measure(paths, probe_bytes=4 * MiB, rounds=1)
        assert m.direct_bps is None and "refuses O_DIRECT" in m.note
        assert writerates.choose(m).direct_above == 0
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_doctor_shows_the_measured_rates_and_the_choice(tmp_path, capsys):
    paths = state(tmp_path / "state")
    argv = ["--config-dir", str(tmp_path / "etc"), "--state-dir", str(paths.state_dir), "--json", "doctor"]
    assert main(argv) == 0
    (unmeasured,) = [f for f in json.loads(capsys.readouterr().out) if f["name"] == "capture_direct_above"]
    assert unmeasured["how"] == "not measured" and unmeasured["value"] == "2G", unmeasured

    m, _ = writerates.refresh(paths)
    assert main(argv) == 0
    (found,) = [f for f in json.loads(capsys.readouterr().out) if f["name"] == "capture_direct_above"]
    choice = writerates.choose(m)
    assert found["how"] == "read" and found["direct_above"] == choice.direct_above
    assert found["buffered_bps"] == round(m.buffered_bps) and found["direct_bps"] == round(m.direct_bps)
    assert found["detail"].startswith(choice.reason) and "(measured " in found["detail"]

    assert main(argv[:-2] + ["doctor"]) == 0
    line = next(li for li in capsys.readouterr().out.splitlines() if li.startswith("capture_direct_above"))
    assert "O_DIRECT" in line and "MiB/s" in line, line
