"""zstd storage: durable temp-then-rename, verification by streaming decompression, byte-identical output."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from corehandler.store import compress
from support.spoolfeed import emit_core


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def core(tmp_path, feeder):
    return emit_core(feeder, tmp_path / "raw.core", 5 << 20, zero_regions=True)


@pytest.mark.parametrize("enabled,level,threads", [(True, 1, 1), (True, 3, 0), (True, 6, 2), (False, 3, 0)])
def test_store_verify_and_decompress_byte_identical(tmp_path, core, enabled, level, threads):
    store = tmp_path / "store"
    store.mkdir()
    stored = compress.store_file(core, store, "id1", enabled=enabled, level=level, threads=threads)
    assert stored.path == store / ("id1.zst" if enabled else "id1.core")
    assert os.listdir(store) == [stored.path.name]
    assert stored.path.stat().st_mode & 0o777 == 0o600
    assert stored.raw_bytes == 5 << 20 and stored.sha256 == _sha(core)
    assert stored.stored_bytes == stored.path.stat().st_size
    if enabled:
        assert stored.stored_bytes < stored.raw_bytes / 4
    compress.verify(stored.path, stored.raw_bytes, stored.sha256)
    out = tmp_path / "out"
    with open(out, "wb") as f:
        assert compress.decompress_to(stored.path, f) == (stored.raw_bytes, stored.sha256)
    assert _sha(out) == stored.sha256
    # The zero MiBs became holes.
    assert out.stat().st_blocks * 512 < out.stat().st_size * 3 // 4


def test_decompress_to_a_pipe(tmp_path, core):
    stored = compress.store_file(core, tmp_path, "id1")
    reader = subprocess.Popen(["sha256sum"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    compress.decompress_to(stored.path, reader.stdin)
    reader.stdin.close()
    assert reader.stdout.read().split()[0].decode() == stored.sha256
    assert reader.wait() == 0


@pytest.mark.parametrize("check", ["verify", "verify_written"])
@pytest.mark.parametrize("damage", ["flip", "flip checksum", "truncate", "append"])
def test_corrupt_store_file_fails_verification(tmp_path, core, damage, check):
    """verify (what `dump` runs: sha256 against the index) and verify_written (ingest's: the frame's own
    content checksum) catch the same damage."""
    stored = compress.store_file(core, tmp_path, "id1")
    compress.verify_written(stored)
    data = bytearray(stored.path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "flip checksum":
        data[-1] ^= 0x01  # the frame's last 4 bytes: XXH64 of the original bytes
    elif damage == "truncate":
        del data[len(data) // 2:]
    else:
        data += b"trailing garbage"
    stored.path.write_bytes(bytes(data))
    with pytest.raises(compress.VerifyError):
        if check == "verify":
            compress.verify(stored.path, stored.raw_bytes, stored.sha256)
        else:
            compress.verify_written(stored)


def test_verify_written_compares_sha256_where_there_is_no_frame_checksum(tmp_path, core):
    import dataclasses

    import zstandard

    path = tmp_path / "id1.zst"
    path.write_bytes(zstandard.ZstdCompressor(write_checksum=False).compress(core.read_bytes()))
    stored = compress.Stored(path, core.stat().st_size, path.stat().st_size, _sha(core), True, 0.0)
    compress.verify_written(stored)
    with pytest.raises(compress.VerifyError, match="sha256"):
        compress.verify_written(dataclasses.replace(stored, sha256="0" * 64))
    raw = compress.store_file(core, tmp_path, "id2", enabled=False)
    with pytest.raises(compress.VerifyError, match="sha256"):
        compress.verify_written(dataclasses.replace(raw, sha256="0" * 64))
    with pytest.raises(compress.VerifyError, match="expected 1$"):
        compress.verify_written(dataclasses.replace(stored, raw_bytes=1))


def test_wrong_size_or_hash_fails_verification(tmp_path, core):
    stored = compress.store_file(core, tmp_path, "id1")
    with pytest.raises(compress.VerifyError, match="expected 1$"):
        compress.verify(stored.path, 1, stored.sha256)
    with pytest.raises(compress.VerifyError, match="sha256"):
        compress.verify(stored.path, stored.raw_bytes, "0" * 64)


def test_interrupted_store_leaves_no_temp_file(tmp_path, core):
    class Stop(Exception):
        pass

    def checkpoint(point):
        if point == "compressed":
            raise Stop

    with pytest.raises(Stop):
        compress.store_file(core, tmp_path / "", "id1", checkpoint=checkpoint)
    assert sorted(os.listdir(tmp_path)) == ["raw.core"]


def test_missing_source_is_a_compress_error(tmp_path):
    with pytest.raises(compress.CompressError, match="cannot store id1"):
        compress.store_file(tmp_path / "nothing", tmp_path, "id1")
    assert os.listdir(tmp_path) == []


def test_threads_zero_means_one_per_cpu():
    assert compress.resolve_threads(0) == os.cpu_count()
    assert compress.resolve_threads(3) == 3


def test_decompress_to_an_append_mode_file_keeps_the_zeros(tmp_path, core):
    stored = compress.store_file(core, tmp_path, "id1")
    out = tmp_path / "out"
    out.write_bytes(b"head")
    with open(out, "ab") as f:  # what `corehandler dump ID >> file` gives us
        compress.decompress_to(stored.path, f)
    assert out.read_bytes() == b"head" + core.read_bytes()
