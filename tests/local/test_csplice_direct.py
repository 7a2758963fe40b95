"""The direct strategy: chosen by the crashed process's resident size or, within a dump written with rw, by how
fast that dump goes (direct_rate), written past the page cache with O_DIRECT, and refused gracefully where the
filesystem has no direct I/O. Byte-identity, limits, holes and full
disks are checked for it with every other strategy (test_csplice_feed, test_csplice_limits, test_csplice_spool)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from support.csplice_harness import Handler, MiB, core_args, expected_digest, hash_file, make_fake_proc


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
    handler = Handler(tmp_path / "h", settings={"strategy": "splice", "direct_above": threshold})
    result = handler.feed(3 * MiB + 7)
    assert_identical(result, 3 * MiB + 7)
    assert result.capture["strategy"] == expected
    assert result.record["handler"]["settings"]["direct_above"] == threshold


def test_unknown_resident_size_keeps_the_configured_strategy(tmp_path):
    # A status without VmRSS (a kernel thread, a process gone before csplice read it) says nothing of its size.
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"fake", [b"fake"], b"/usr/bin/fake")
    handler = Handler(tmp_path / "h", settings={"strategy": "rw", "direct_above": 1},
                      env={"CSPLICE_PROC_ROOT": str(proc_root)})
    result = handler.feed(MiB, pid=4242)
    assert_identical(result, MiB)
    assert result.capture["strategy"] == "rw"


def paced_capture(handler: Handler, slots: int, pause: float) -> dict:
    """csplice reads a dump of `slots` 8 MiB pieces that arrive `pause` seconds apart (a dump the disk keeps up
    with); returns the record."""
    r, w = os.pipe()
    proc = subprocess.Popen([str(handler.csplice), *core_args(os.getpid())], stdin=r, env=handler.environment(),
                            stderr=subprocess.DEVNULL)
    os.close(r)
    slot = bytes(range(1, 256)) * (8 * MiB // 255) + b"\x01" * (8 * MiB % 255)
    try:
        os.write(w, b"\x7fELF")
        for _ in range(slots):
            time.sleep(pause)
            os.write(w, slot)
    finally:
        os.close(w)
    assert proc.wait(timeout=60) == 0
    (record,) = handler.records().values()
    return record


@pytest.mark.parametrize("pause", (0.2, 0), ids=("disk keeps up", "pipe outruns the disk"))
def test_direct_leaves_the_page_cache_alone(tmp_path, pause):
    # tmp_path must be a filesystem with direct I/O that is not memory itself (tmpfs keeps every page cached).
    fstype = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip()
    if fstype in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is on {fstype}: its pages are the file")
    handler = Handler(tmp_path / "h", settings={"strategy": "direct"})
    record = paced_capture(handler, 6, pause)
    assert record["capture"]["strategy"] == "direct" and record["capture"]["bytes"] == 4 + 48 * MiB
    # No slot goes through the page cache, not even while the writer lags (capture.c, ring_write, says why);
    # the first block's magic is read back (the ELF check) and may stay cached.
    assert cached_pages(handler.spool / record["core"]) < 48 * MiB // 4096 // 16

    rw = Handler(tmp_path / "rw", settings={"strategy": "rw"})
    record = paced_capture(rw, 6, 0)
    assert cached_pages(rw.spool / record["core"]) > 40 * MiB // 4096, "the page cache comparison means nothing"


# Faster than any disk: every window of rw (4 MiB, capture.c's ADAPT_WINDOW) is "slower than direct", so the
# hand-off comes after the first.
UNREACHABLE_RATE = 1 << 50


@pytest.mark.parametrize("mode", ("write", "vmsplice"))
def test_rw_hands_a_slow_dump_to_direct_at_an_aligned_offset(tmp_path, mode):
    """The feeder writes odd-sized pieces, so rw's reads leave the file offset unaligned: rw aligns it before
    O_DIRECT takes over, and the file is byte-identical, holes included."""
    handler = Handler(tmp_path / "h", settings={"strategy": "rw", "direct_rate": UNREACHABLE_RATE})
    size = 40 * MiB + 4099
    result = handler.feed(size, mode=mode, zero_regions=True, chunk=65537 if mode == "write" else None)
    assert_identical(result, size, zero_regions=True)
    cap = result.capture
    assert cap["strategy"] == "rw" and cap["direct_from"] is not None, cap
    assert 4 * MiB <= cap["direct_from"] <= 5 * MiB and cap["direct_from"] % 4096 == 0, cap
    assert result.record["handler"]["settings"]["direct_rate"] == UNREACHABLE_RATE


def test_rw_keeps_a_dump_that_runs_fast_enough_and_a_small_one(tmp_path):
    slow_disk = Handler(tmp_path / "slow", settings={"strategy": "rw", "direct_rate": 1})
    result = slow_disk.feed(40 * MiB + 1)
    assert_identical(result, 40 * MiB + 1)
    assert result.capture["direct_from"] is None
    # Shorter than one window: never measured, never moved.
    small = Handler(tmp_path / "small", settings={"strategy": "rw", "direct_rate": UNREACHABLE_RATE})
    result = small.feed(3 * MiB)
    assert_identical(result, 3 * MiB)
    assert result.capture["direct_from"] is None


def test_the_hand_off_respects_the_size_limit(tmp_path):
    handler = Handler(tmp_path / "h", settings={"strategy": "rw", "direct_rate": UNREACHABLE_RATE,
                                                "max_dump_size": 24 * MiB + 5})
    result = handler.feed(40 * MiB)
    cap = result.capture
    assert cap["direct_from"] is not None and cap["truncated_reason"] == "max_dump_size", cap
    assert cap["bytes"] == result.core.stat().st_size == 24 * MiB + 5
    assert cap["bytes"] + cap["drained_bytes"] == 40 * MiB


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

        # A hand-off from rw is refused the same way, before a byte moved: rw goes on where it was.
        handler = Handler(mnt / "handoff", settings={"strategy": "rw", "direct_rate": UNREACHABLE_RATE})
        result = handler.feed(20 * MiB + 1, mode=mode, zero_regions=True)
        assert_identical(result, 20 * MiB + 1, zero_regions=True)
        assert result.capture["strategy"] == "rw" and result.capture["direct_from"] is None
        assert "Moving to O_DIRECT writes refused" in result.stderr
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)
