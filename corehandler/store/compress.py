"""Stored dumps: zstd compression to a temp file verified as it is written, made durable and renamed into place;
verification of a stored file, and decompression for `dump`. With compression off, dumps are stored raw."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import queue
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

import zstandard

from corehandler import idlecpus
from corehandler.atomicfile import fsync_dir
from corehandler.errors import CorehandlerError

CHUNK = 1 << 20
# Output holes are made per block of this size that is all zeros.
HOLE = 64 << 10
_ZEROS = bytes(HOLE)
COMPRESSED_SUFFIX, RAW_SUFFIX = ".zst", ".core"


class CompressError(CorehandlerError):
    """Compressing or storing failed; the raw dump is untouched."""


class DiskFullError(CompressError):
    """No space left for the stored dump; the raw dump is kept for a later attempt."""


class VerifyError(CorehandlerError):
    """A stored dump does not decompress, or not to the size and hash recorded at ingest."""


@dataclass(frozen=True)
class Stored:
    path: Path
    raw_bytes: int
    stored_bytes: int
    sha256: str
    compressed: bool
    seconds: float
    workers: int = 0      # zstd's worker threads (0: stored raw, or found in place)


class _Hasher:
    """The raw bytes' sha256, taken in a thread of its own (hashlib lets go of the GIL on large updates) so that
    it runs beside the compression instead of before each of its chunks; at most DEPTH chunks behind, so a
    compression paused for a capture stops hashing within a few milliseconds too."""

    DEPTH = 4

    def __init__(self):
        self.digest = hashlib.sha256()
        self._chunks: queue.Queue = queue.Queue(self.DEPTH)
        self._thread = threading.Thread(target=self._run, name="store-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._chunks.get()) is not None:
            self.digest.update(chunk)

    def update(self, chunk: bytes) -> None:
        self._chunks.put(chunk)

    def hexdigest(self) -> str:
        self.close()
        return self.digest.hexdigest()

    def close(self) -> None:
        if self._thread.is_alive():
            self._chunks.put(None)
            self._thread.join()


def resolve_threads(threads: int | str) -> int:
    """zstd's workers for [compression] threads: a number as it is; "auto" (or 0, its older spelling) as many as
    there are idle CPUs now (idlecpus.py), asked afresh for every dump, since a worker count is fixed for a
    frame. The hashing runs beside them in a thread of its own, the verifying decompression in store_file's."""
    if isinstance(threads, int) and threads > 0:
        return threads
    return idlecpus.idle_cpus()


def stored_name(dump_id: str, compressed: bool) -> str:
    return dump_id + (COMPRESSED_SUFFIX if compressed else RAW_SUFFIX)


def store_file(src: Path, store_dir: Path, dump_id: str, *, enabled: bool = True, level: int = 3,
               threads: int | str = "auto", checkpoint: Callable[[str], None] | None = None) -> Stored:
    """Writes src into store_dir as <id>.zst (or <id>.core when compression is off): temp file, fsync,
    rename, fsync of the directory; the file renamed into place is verified. Raises DiskFullError on
    ENOSPC/EDQUOT, VerifyError when what was written does not read back, CompressError otherwise; whichever,
    no temp file is left behind and src is untouched.

    One pass over src: its sha256 is taken as it is read, and the compressed bytes are decompressed as they
    are written (zstd checks the content checksum it wrote, the XXH64 of the original bytes, at the end), so
    the stored file is verified without being read back (bench/results/compress.md measures what that saves).
    A raw copy has no checksum of its own: it is read back and hashed.

    checkpoint(name) is called at the named steps (the daemon's test-only pause points) and between chunks
    ("compressing"), where the daemon waits while a capture runs: no chunk is fed meanwhile, so zstd's workers
    and the hashing thread finish the few MiB they hold and idle.

    threads: zstd's workers (resolve_threads); the frame is the same one zstd writes with any count (a single
    frame with its content size and checksum), readable by open_stored and the zstd CLI alike."""
    start = time.monotonic()
    final = store_dir / stored_name(dump_id, enabled)
    tmp = store_dir / f".tmp.{final.name}"
    digest = _Hasher()
    raw = workers = 0
    try:
        with open(src, "rb") as fin, \
                open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600), "wb") as fout:
            if enabled:
                check = _Readback(fout)
                workers = resolve_threads(threads)
                cctx = zstandard.ZstdCompressor(level=level, threads=workers, write_checksum=True)
                sink = cctx.stream_writer(check, size=os.fstat(fin.fileno()).st_size, closefd=False,
                                          write_size=CHUNK)
            else:
                sink = fout
            while chunk := fin.read(CHUNK):
                digest.update(chunk)
                raw += len(chunk)
                sink.write(chunk)
                if checkpoint:
                    checkpoint("compressing")
            if enabled:
                sink.close()
                check.done(tmp.name, raw)
            fout.flush()
            os.fsync(fout.fileno())
        if not enabled:
            verify(tmp, raw, digest.hexdigest())
        if checkpoint:
            checkpoint("compressed")
        os.rename(tmp, final)
        fsync_dir(store_dir)
    except (OSError, zstandard.ZstdError) as e:
        digest.close()
        tmp.unlink(missing_ok=True)
        code = getattr(e, "errno", None)
        if code in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(e):
            raise DiskFullError(f"no space left to store {dump_id} in {store_dir}") from e
        raise CompressError(f"cannot store {dump_id}: {e}") from e
    except BaseException:
        digest.close()
        tmp.unlink(missing_ok=True)
        raise
    return Stored(final, raw, final.stat().st_size, digest.hexdigest(), enabled, time.monotonic() - start, workers)


class _Readback:
    """The compressor's output: written to the file and decompressed on the way, which checks what was
    compressed against the frame's content checksum at the frame's end (done)."""

    def __init__(self, out: BinaryIO):
        self.out = out
        self.decompressor = zstandard.ZstdDecompressor().decompressobj()
        self.total = 0

    def write(self, data: bytes) -> int:
        self.out.write(data)
        try:
            self.total += len(self.decompressor.decompress(data))
        except zstandard.ZstdError as e:
            raise VerifyError(f"the compressed stream does not decompress: {e}") from e
        return len(data)

    def flush(self) -> None:
        self.out.flush()

    def done(self, name: str, raw_bytes: int) -> None:
        if not self.decompressor.eof:
            raise VerifyError(f"{name}: the compressed stream ends before its frame does")
        if self.decompressor.unused_data:
            raise VerifyError(f"{name}: the compressed stream goes on past its frame")
        if self.total != raw_bytes:
            raise VerifyError(f"{name} decompresses to {self.total} bytes, {raw_bytes} were compressed")


def find_stored(store_dir: Path, dump_id: str) -> Path | None:
    """The dump's stored file, compressed or not, if there is one (renamed into place: complete)."""
    for compressed in (True, False):
        path = store_dir / stored_name(dump_id, compressed)
        if path.exists():
            return path
    return None


def adopt(path: Path) -> Stored:
    """A stored file found in place, measured and verified by reading it whole; VerifyError if it fails."""
    start = time.monotonic()
    raw, digest = measure(path)
    check_header(path, raw)  # a frame cut at a block's end decompresses without an error, short
    return Stored(path, raw, path.stat().st_size, digest, path.name.endswith(COMPRESSED_SUFFIX),
                  time.monotonic() - start)


class _Paced:
    """A file whose reads call pace(n) with the bytes they got (the scrub's rate limit)."""

    def __init__(self, f: BinaryIO, pace: Callable[[int], None]):
        self.f, self.pace = f, pace

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.pace(len(data))
        return data

    def close(self) -> None:
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_stored(path: Path, pace: Callable[[int], None] | None = None) -> BinaryIO:
    """A reader of the dump's original bytes, compressed or raw; pace(n) is told of every n bytes read from
    the disk."""
    f = open(path, "rb", buffering=0 if pace else -1)
    if pace:
        f = _Paced(f, pace)
    if path.name.endswith(COMPRESSED_SUFFIX):
        return zstandard.ZstdDecompressor().stream_reader(f, read_size=CHUNK, read_across_frames=True, closefd=True)
    return f


def _copy(path: Path, write: Callable[[bytes], object], progress: Callable[[int], None] | None = None,
          pace: Callable[[int], None] | None = None, limit: int | None = None) -> tuple[int, str]:
    digest = hashlib.sha256()
    total = 0
    try:
        with open_stored(path, pace) as reader:
            while chunk := reader.read(CHUNK):
                digest.update(chunk)
                total += len(chunk)
                if limit is not None and total > limit:
                    raise VerifyError(f"{path.name} decompresses to more than the {limit} bytes expected")
                write(chunk)
                if progress:
                    progress(len(chunk))
    except zstandard.ZstdError as e:
        raise VerifyError(f"{path.name} does not decompress: {e}") from e
    return total, digest.hexdigest()


def verify(path: Path, raw_bytes: int, sha256: str | None, pace: Callable[[int], None] | None = None) -> None:
    """Raises VerifyError unless path decompresses to raw_bytes bytes with that sha256 (read at pace's rate)."""
    total, digest = _copy(path, lambda chunk: None, pace=pace)
    if total != raw_bytes:
        raise VerifyError(f"{path.name} decompresses to {total} bytes, expected {raw_bytes}")
    if sha256 and digest != sha256:
        raise VerifyError(f"{path.name} decompresses to data with sha256 {digest}, expected {sha256}")


def check_header(path: Path, raw_bytes: int) -> None:
    """A cheap check (no decompression): a compressed file starts with a zstd frame of the right size."""
    if not path.name.endswith(COMPRESSED_SUFFIX):
        return
    with open(path, "rb") as f:
        head = f.read(18)  # the longest frame header
    try:
        params = zstandard.get_frame_parameters(head)
    except zstandard.ZstdError as e:
        raise VerifyError(f"{path.name} does not start with a zstd frame: {e}") from e
    if params.content_size not in (raw_bytes, zstandard.CONTENTSIZE_UNKNOWN):
        raise VerifyError(f"{path.name} says it holds {params.content_size} bytes, expected {raw_bytes}")


def measure(path: Path) -> tuple[int, str]:
    """Size and sha256 of the original bytes; VerifyError if the file is corrupt."""
    return _copy(path, lambda chunk: None)


def decompress_to(path: Path, out: BinaryIO, progress: Callable[[int], None] | None = None,
                  limit: int | None = None) -> tuple[int, str]:
    """Writes the original bytes to out, VerifyError past limit bytes (a size another party gave: nothing
    more is written); a regular file gets holes where the dump has zero pages (cores are often mostly
    zeros), which reads back identically. Returns size and sha256."""
    fd = out.fileno()
    # Holes need seeks; with O_APPEND (`>>`) every write lands at the end, so a seek would lose the zeros.
    sparse = stat.S_ISREG(os.fstat(fd).st_mode) and out.seekable() and \
        not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND
    if not sparse:
        return _copy(path, out.write, progress, limit=limit)
    start = out.tell()

    def write(chunk: bytes) -> None:
        view = memoryview(chunk)
        for pos in range(0, len(chunk), HOLE):
            block = view[pos:pos + HOLE]
            if block[:1] == b"\0" and block[-1:] == b"\0" and block == _ZEROS[:len(block)]:
                out.seek(len(block), os.SEEK_CUR)
            else:
                out.write(block)

    result = _copy(path, write, progress, limit=limit)
    out.truncate(start + result[0])
    return result
