"""zstd storage: durable temp-then-rename, verified as it is written, byte-identical output; verification of a
stored file."""

from __future__ import annotations

import hashlib
import io
import os
import resource
import subprocess
import time

import pytest
import zstandard

from corehandler import idlecpus
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


DAMAGE = ["flip", "flip checksum", "truncate", "append"]


def damaged(data: bytes, damage: str) -> bytes:
    data = bytearray(data)
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "flip checksum":
        data[-1] ^= 0x01  # the frame's last 4 bytes: XXH64 of the original bytes
    elif damage == "truncate":
        del data[len(data) // 2:]
    else:
        data += b"trailing garbage"
    return bytes(data)


@pytest.mark.parametrize("damage", DAMAGE)
def test_corrupt_store_file_fails_verification(tmp_path, core, damage):
    """verify (what `dump` and `info` run: sha256 against the index) and adopt (what ingest runs on a stored
    file a kill left in place: the frame's own content checksum) catch the damage."""
    stored = compress.store_file(core, tmp_path, "id1")
    adopted = compress.adopt(stored.path)
    assert (adopted.raw_bytes, adopted.stored_bytes, adopted.sha256) == (stored.raw_bytes, stored.stored_bytes,
                                                                       stored.sha256)
    stored.path.write_bytes(damaged(stored.path.read_bytes(), damage))
    with pytest.raises(compress.VerifyError):
        compress.verify(stored.path, stored.raw_bytes, stored.sha256)
    with pytest.raises(compress.VerifyError):
        compress.adopt(stored.path)


@pytest.mark.parametrize("damage", DAMAGE)
def test_the_compressed_stream_is_verified_as_it_is_written(tmp_path, core, damage, monkeypatch):
    """store_file decompresses what it writes on the way: damage between the compressor and the file (here:
    the whole stream damaged, then handed on in pieces as the compressor does) fails the store, and leaves
    neither a stored file nor a temp file."""
    good = zstandard.ZstdCompressor(write_checksum=True).compress(core.read_bytes())
    check = compress._Readback(io.BytesIO())
    for i in range(0, len(good), 4096):
        check.write(good[i:i + 4096])
    check.done("good", core.stat().st_size)

    class Damaging(compress._Readback):
        def __init__(self, out):
            super().__init__(out)
            self.buffered = b""

        def write(self, data):
            self.buffered += data
            return len(data)

        def flush(self):
            pass

        def hand_on(self):
            bad = damaged(self.buffered, damage)
            for i in range(0, len(bad), 4096):
                super().write(bad[i:i + 4096])

        def done(self, name, raw_bytes):
            self.hand_on()
            super().done(name, raw_bytes)

    monkeypatch.setattr(compress, "_Readback", Damaging)
    store = tmp_path / "store"
    store.mkdir()
    with pytest.raises(compress.VerifyError):
        compress.store_file(core, store, "id1")
    assert os.listdir(store) == []


def test_a_stored_file_in_place_is_found_and_adopted(tmp_path, core):
    assert compress.find_stored(tmp_path, "id1") is None
    raw = compress.store_file(core, tmp_path, "id1", enabled=False)
    assert compress.find_stored(tmp_path, "id1") == raw.path
    adopted = compress.adopt(raw.path)
    assert (adopted.raw_bytes, adopted.sha256, adopted.compressed) == (raw.raw_bytes, raw.sha256, False)
    raw.path.unlink()
    stored = compress.store_file(core, tmp_path, "id1")
    assert compress.find_stored(tmp_path, "id1") == stored.path
    assert compress.adopt(stored.path).sha256 == stored.sha256


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


def test_auto_threads_are_the_idle_cpus(monkeypatch):
    monkeypatch.setattr(idlecpus, "idle_cpus", lambda: 7)
    assert compress.resolve_threads("auto") == compress.resolve_threads(0) == 7
    assert compress.resolve_threads(3) == 3


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_any_worker_count_writes_one_frame_that_zstd_reads(tmp_path, feeder, workers):
    """The stored bytes are the same format whatever the count: one frame with its content size and checksum,
    which zstd's CLI and open_stored read back to the original."""
    core = emit_core(feeder, tmp_path / "raw.core", 24 << 20, zero_regions=True)
    store = tmp_path / "store"
    store.mkdir()
    stored = compress.store_file(core, store, "id1", level=1, threads=workers)
    assert stored.workers == workers and stored.sha256 == _sha(core)
    data = stored.path.read_bytes()
    params = zstandard.get_frame_parameters(data)
    assert params.content_size == core.stat().st_size and params.has_checksum
    assert zstandard.frame_content_size(data) == core.stat().st_size
    assert zstandard.ZstdDecompressor().decompress(data) == core.read_bytes()  # raises past one frame's end
    out = subprocess.run(["zstd", "-d", "-c", str(stored.path)], capture_output=True, check=True).stdout
    assert hashlib.sha256(out).hexdigest() == stored.sha256
    compress.check_header(stored.path, stored.raw_bytes)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process: zstd's workers too
    return usage.ru_utime + usage.ru_stime


def test_a_paused_compression_leaves_the_cpus_to_the_capture(tmp_path, feeder):
    """While the daemon's checkpoint waits (a capture runs: capture.Yield), the workers and the hashing thread
    finish what they hold and then take no CPU; the compression resumes and stores the same bytes."""
    core = emit_core(feeder, tmp_path / "raw.core", 96 << 20)
    store = tmp_path / "store"
    store.mkdir()
    paused = {}

    def checkpoint(point):
        if point == "compressing" and "cpu" not in paused and len(paused.setdefault("chunks", [])) == 16:
            time.sleep(0.3)  # what the workers hold: done in a few ms
            start = _cpu_seconds()
            time.sleep(1.0)
            paused["cpu"] = _cpu_seconds() - start
        elif point == "compressing":
            paused["chunks"].append(1)

    stored = compress.store_file(core, store, "id1", level=1, threads=2, checkpoint=checkpoint)
    assert paused["cpu"] < 0.05, paused["cpu"]
    assert stored.sha256 == _sha(core)
    compress.verify(stored.path, stored.raw_bytes, stored.sha256)


def test_decompress_to_an_append_mode_file_keeps_the_zeros(tmp_path, core):
    stored = compress.store_file(core, tmp_path, "id1")
    out = tmp_path / "out"
    out.write_bytes(b"head")
    with open(out, "ab") as f:  # what `corehandler dump ID >> file` gives us
        compress.decompress_to(stored.path, f)
    assert out.read_bytes() == b"head" + core.read_bytes()
