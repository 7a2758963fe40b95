"""The direct strategy: chosen by the crashed process's resident size, written past the page cache with
O_DIRECT, and refused gracefully where the filesystem has no direct I/O. Byte-identity, limits, holes and full
disks are checked for it with every other strategy (test_csplice_feed, test_csplice_limits, test_csplice_spool)."""

from __future__ import annotations

import os
import subprocess

import pytest

from support.csplice_harness import MiB, Handler, expected_digest, hash_file, make_fake_proc


def resident_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def cached_pages(path) -> int:
    """Pages of path in the page cache, as util-linux's fincore counts them."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "PAGES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def assert_identical(result, size: int, zero_regions: bool = False) -> None:
    assert result.returncode == 0, result.stderr
    assert result.capture["complete"] and result.capture["bytes"] == size, result.capture
    assert result.core.stat().st_size == size
    assert hash_file(result.core) == expected_digest(size, zero_regions, result.record["pid"])


@pytest.mark.parametrize("threshold,expected", ((1, "direct"), (1 << 40, "splice"), (0, "splice")),
                         ids=("above", "below", "off"))
def test_direct_is_chosen_by_the_processes_resident_size(tmp_path, threshold, expected):
    # The "crashed" process is this one: csplice reads its VmRSS from the real /proc/PID/status.
    assert 1 < resident_bytes(os.getpid()) < 1 << 40
    handler = Handler(tmp_path / "h", settings={"strategy": "splice", "direct_above_bytes": threshold})
    result = handler.feed(3 * MiB + 7)
    assert_identical(result, 3 * MiB + 7)
    assert result.capture["strategy"] == expected
    assert result.record["handler"]["settings"]["direct_above_bytes"] == threshold


def test_unknown_resident_size_keeps_the_configured_strategy(tmp_path):
    # A status without VmRSS (a kernel thread, a process gone before csplice read it) says nothing of its size.
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"fake", [b"fake"], b"/usr/bin/fake")
    handler = Handler(tmp_path / "h", settings={"strategy": "rw", "direct_above_bytes": 1},
                      env={"CSPLICE_PROC_ROOT": str(proc_root)})
    result = handler.feed(MiB, pid=4242)
    assert_identical(result, MiB)
    assert result.capture["strategy"] == "rw"


def test_direct_leaves_the_page_cache_alone(tmp_path):
    # tmp_path must be a filesystem with direct I/O that is not memory itself (tmpfs keeps every page cached).
    fstype = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip()
    if fstype in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is on {fstype}: its pages are the file")
    handler = Handler(tmp_path / "h", settings={"strategy": "direct"})
    result = handler.feed(64 * MiB + 100)
    assert result.capture["strategy"] == "direct"
    # Only the padded tail block, read back for the ELF magic, or nothing, may be cached: not the 64 MiB.
    assert cached_pages(result.core) <= 4
    assert_identical(result, 64 * MiB + 100)

    rw = Handler(tmp_path / "rw", settings={"strategy": "rw"}).feed(64 * MiB)
    assert cached_pages(rw.core) > 8 * 1024, "the page cache comparison is meaningless here"


@pytest.mark.root
@pytest.mark.parametrize("mode", ("write", "vmsplice"))
def test_direct_falls_back_to_rw_where_the_filesystem_refuses_o_direct(tmp_path, mode):
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    # ramfs has no direct I/O at all: open() and F_SETFL refuse O_DIRECT with EINVAL.
    subprocess.run(["mount", "-t", "ramfs", "-o", "mode=0700", "ramfs", str(mnt)], check=True)
    try:
        handler = Handler(mnt / "h", settings={"strategy": "direct"})
        result = handler.feed(9 * MiB + 1, mode=mode, zero_regions=True)
        assert_identical(result, 9 * MiB + 1, zero_regions=True)
        assert result.capture["strategy"] == "rw"
        assert "Strategy direct refused" in result.stderr
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)
