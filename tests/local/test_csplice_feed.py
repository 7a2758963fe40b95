"""Captures through both kernel paths (the feeder's write() and vmsplice()) are byte-identical to what was fed,
for every strategy, with and without zero regions, under a 16-page chunk and an enlarged pipe."""

from __future__ import annotations

import os
import shutil

import pytest

from corehandler.csplice_contract import STRATEGIES
from support.csplice_harness import GiB, Handler, MiB, expected_digest, hash_file

MODES = ("write", "vmsplice")
SIZES = (0, 1, 4095, 65537, 100 * MiB)
# The 16-page splice loop moved 64 KiB a call; the enlarged pipe is what F_SETPIPE_SZ buys (1 MiB).
TUNINGS = {
    "chunk16p": {"chunk_size": 16 * 4096, "pipe_size": 0},
    "pipe1m": {"chunk_size": 1 * MiB, "pipe_size": 1 * MiB},
}


@pytest.fixture
def handler(tmp_path):
    h = Handler(tmp_path / "h")
    yield h
    # 100 MiB cores add up over a session; pytest keeps old tmp dirs around.
    shutil.rmtree(h.spool, ignore_errors=True)


def assert_identical(result, size: int, zero_regions: bool) -> None:
    assert result.returncode == 0, result.stderr
    cap = result.capture
    if size == 0:  # nothing came: a metadata-only record, no empty core (test_csplice_input.py)
        assert result.core is None and (cap["dropped_reason"], cap["bytes"]) == ("empty", 0), result.record
        return
    assert (cap["complete"], cap["truncated"], cap["dropped"]) == (True, False, False), result.record
    assert cap["bytes"] == size and cap["drained_bytes"] == 0
    assert cap["elf_magic"] == (size >= 4)
    assert result.record["errors"] == [] or size < 4, result.record["errors"]
    assert result.core.stat().st_size == size
    assert hash_file(result.core) == expected_digest(size, zero_regions, result.record["pid"])
    assert result.core.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("tuning", TUNINGS)
@pytest.mark.parametrize("zero_regions", (False, True), ids=("dense", "zeros"))
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("mode", MODES)
def test_capture_is_byte_identical(handler, mode, strategy, size, zero_regions, tuning):
    handler.configure(strategy=strategy, **TUNINGS[tuning])
    result = handler.feed(size, mode=mode, zero_regions=zero_regions, pipe_size=TUNINGS[tuning]["pipe_size"])
    assert_identical(result, size, zero_regions)
    assert result.capture["strategy"] == strategy
    assert result.feeder["push_error"] == 0


@pytest.mark.parametrize("sparse", (True, False))
@pytest.mark.parametrize("strategy", ("rw", "rw2", "direct"))
def test_zero_regions_become_holes_only_when_sparse(handler, strategy, sparse):
    handler.configure(strategy=strategy, sparse=sparse)
    result = handler.feed(32 * MiB, zero_regions=True)
    assert_identical(result, 32 * MiB, True)
    allocated = result.core.stat().st_blocks * 512
    if sparse:
        # Every other MiB of the load segment is zeros: about half the file needs no blocks.
        assert allocated < 20 * MiB, allocated
    else:
        assert allocated >= 32 * MiB, allocated


@pytest.mark.slow
@pytest.mark.parametrize("mode,strategy", (("write", "rw2"), ("vmsplice", "splice2")))
def test_one_gib_is_byte_identical(handler, mode, strategy):
    handler.configure(strategy=strategy, pipe_size=MiB, chunk_size=MiB)
    result = handler.feed(GiB, mode=mode, zero_regions=(mode == "write"), pipe_size=MiB, timeout=600)
    assert_identical(result, GiB, mode == "write")
    os.unlink(result.core)
