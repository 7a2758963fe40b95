"""Sending a stream into the bucket in parts whose SHA-256 the server checks: one hash pass per byte, ours.

Each part is read once into memory (at most `concurrency` + 1 parts at a time), hashed once, and sent as it is
with that digest as its `x-amz-checksum-sha256`: the server refuses a part whose bytes do not match, and the
header is signed, so neither botocore's checksum nor its SigV4 payload hash (bucket.client) reads the part
again. Through s3transfer, which did the sending before, botocore hashed every part twice more (its checksum
and, over http, the signature's payload hash) beside our own digest. The part digests are also what
payload.Digests keeps, so the HEAD afterwards is checked against exactly what was sent.

A stream no longer than one part goes up in one PUT; a longer one as a multipart upload (its parts sent in
order of reading by a pool of `concurrency` threads), aborted when a part fails or `stop` is set (one that a
kill leaves behind is aborted by the uploader's next start). `bandwidth` (bytes/s, 0 = none) paces the start
of each part, so the upload's average rate stays under it. `yield_to()` (which waits while csplice captures:
corehandler/capture.py) is called before each part starts and after every PACE bytes a part sends: a part
already on the wire when a crash comes stops within a MiB, so neither our sending nor the server's receiving
takes the CPUs and the disk from the capture (bench/results/stored-upload.md).
"""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from corehandler.fleet.payload import Digests, from_parts

MIN_PART = 5 << 20   # S3's smallest part but the last
MAX_PARTS = 10_000   # and most parts of one upload
PACE = 1 << 20       # bytes a part sends between two asks of yield_to
# Longest a part on the wire stands still at one ask: S3 drops a request whose socket was idle for ~20 s.
ON_WIRE_WAIT_SEC = 10.0


class Cancelled(Exception):
    """`stop` was set while the stream was going up; its multipart upload is aborted."""


def part_size_for(part_size: int, size: int) -> int:
    """The part size an object of `size` bytes is sent in: part_size, at least S3's minimum, doubled until
    the object fits in MAX_PARTS parts."""
    part = max(part_size, MIN_PART)
    while size > part * MAX_PARTS:
        part *= 2
    return part


def read_part(source, size: int) -> bytes:
    """Up to size bytes of source (fewer only at its end): for a file, one read straight into the bytes that
    are sent (bytes, not a bytearray: not every S3 client library takes one)."""
    data = source.read(size)
    if len(data) in (0, size):
        return data
    chunks, got = [data], len(data)
    while got < size and (more := source.read(size - got)):
        chunks.append(more)
        got += len(more)
    return b"".join(chunks)


class Paced:
    """A part's bytes as the HTTP client reads them (blocks of 16 KiB), asking yield_to(ON_WIRE_WAIT_SEC)
    after every PACE bytes; seekable, so a retried request rewinds it."""

    def __init__(self, body: bytes, yield_to: Callable[..., None]):
        self._body, self._view, self._yield = body, memoryview(body), yield_to
        self._pos = self._asked = 0

    def __len__(self) -> int:
        return len(self._body)

    def read(self, size: int = -1) -> bytes:
        if self._pos - self._asked >= PACE:
            self._yield(ON_WIRE_WAIT_SEC)
            self._asked = self._pos
        end = len(self._body) if size is None or size < 0 else min(len(self._body), self._pos + size)
        data = self._view[self._pos:end].tobytes()
        self._pos = end
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: len(self._body)}[whence]
        self._pos = self._asked = max(0, min(len(self._body), base + offset))
        return self._pos

    def tell(self) -> int:
        return self._pos


def send(client, bucket: str, key: str, source, part_size: int, *, concurrency: int = 4, bandwidth: int = 0,
         extra: dict | None = None, stop: threading.Event | None = None,
         yield_to: Callable[..., None] | None = None) -> Digests:
    """Sends everything source (read()) holds to bucket/key in parts of part_size; the digests of what
    was sent. Raises the failing request's error, or Cancelled. yield_to(longest=None) waits at most longest
    seconds when given."""
    extra = dict(extra or {})
    stop = stop or threading.Event()
    yield_to = yield_to or (lambda longest=None: None)
    yield_to()
    first = read_part(source, part_size)
    second = read_part(source, part_size) if len(first) == part_size else b""
    if not second:
        digest = hashlib.sha256(first).digest()
        client.put_object(Bucket=bucket, Key=key, Body=Paced(first, yield_to), ChecksumSHA256=_b64(digest),
                          **extra)
        return from_parts(len(first), [digest])
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256",
                                               **extra)["UploadId"]
    try:
        return _parts(client, bucket, key, upload_id, source, part_size, (first, second), concurrency,
                      bandwidth, stop, yield_to)
    except BaseException:
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except Exception:  # noqa: BLE001 (the uploader's next start aborts what is left)
            pass
        raise


def _parts(client, bucket, key, upload_id, source, part_size, firsts, concurrency, bandwidth, stop, yield_to):
    room = threading.BoundedSemaphore(max(1, concurrency))  # parts in memory: read, or on the wire

    def put(number: int, body: bytes) -> dict:
        try:
            yield_to()  # a part waiting for a thread since the last ask: the hash is ~40 ms of a CPU
            digest = hashlib.sha256(body).digest()  # releases the GIL: the next part is read meanwhile
            etag = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                      Body=Paced(body, yield_to), ChecksumSHA256=_b64(digest))["ETag"]
            return {"PartNumber": number, "ETag": etag, "ChecksumSHA256": _b64(digest), "_size": len(body),
                    "_digest": digest}
        finally:
            room.release()

    futures: list[Future] = []
    started, queued = time.monotonic(), 0
    with ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="part") as pool:
        try:
            number, pending = 0, list(firsts)
            while True:
                room.acquire()
                yield_to()  # before the read too: the disk is the capture's
                body = pending.pop(0) if pending else read_part(source, part_size)
                if not body:
                    room.release()
                    break
                if bandwidth:  # the part starts when the bytes before it are within the limit
                    stop.wait(max(0.0, started + queued / bandwidth - time.monotonic()))
                yield_to()
                if stop.is_set():
                    room.release()
                    raise Cancelled(f"upload of {key} stopped")
                failed = next((f for f in futures if f.done() and f.exception()), None)
                if failed is not None:
                    room.release()
                    failed.result()
                number += 1
                queued += len(body)
                futures.append(pool.submit(put, number, body))
                del body
            parts = [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    if stop.is_set():
        raise Cancelled(f"upload of {key} stopped")
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id,
        MultipartUpload={"Parts": [{k: v for k, v in p.items() if not k.startswith("_")} for p in parts]})
    return from_parts(sum(p["_size"] for p in parts), [p["_digest"] for p in parts])


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()
