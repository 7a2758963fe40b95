"""What a host puts into the bucket: the sidecar, the record as it may leave the host, the checksums."""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

# 2: layout v2, an encrypted core (core.encryption, core.recipients) and sealed fields (sealed: seal.py).
# Fields added since that readers of 2 may ignore leave it 2 (a newer schema is skipped by every reader):
# no_core (0.6: why core is null, fleet/withoutcore.py).
SIDECAR_SCHEMA = 2


CHUNK = 8 << 20


def fallback_signature(dump) -> str:
    """A signature for dumps without an analysis: the executable and the signal (coarser than the analysed
    one, which adds the top frames)."""
    return f"{dump.exe or dump.comm or '?'}:{dump.signal}"


def signature_key(signature: str) -> str:
    """The signature as a bucket key component."""
    return hashlib.sha256(signature.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def shareable_record(record: dict, *, environ: bool, maps: bool) -> dict:
    """The record as it may leave the host: what [capture] kept locally only stays unless [upload] says."""
    out = dict(record)
    proc = dict(out.get("proc") or {})
    if not environ:
        proc.pop("environ", None)
    if not maps:
        proc.pop("maps", None)
    if "proc" in out:
        out["proc"] = proc
    return out


def sidecar(dump, *, host: str, core: dict | None, budget: str | None, analysis: dict | None, signature: str,
            environ: bool, maps: bool, no_core: dict | None = None) -> dict:
    """no_core: why core is None (fleet/withoutcore.py)."""
    row = {k: v for k, v in dump.summary().items() if k not in ("record", "path", "deleting")}
    return {"schema": SIDECAR_SCHEMA, "id": dump.id, "host": host, "crashed_at": dump.crashed_at,
            "uploaded_at": time.time(), "signature": signature,
            "signature_source": "analysis" if analysis and analysis.get("signature") else "exe+signal",
            "core": core, "no_core": no_core if core is None else None, "budget": budget, "sha256": dump.sha256,
            "index": row, "record": shareable_record(dump.record, environ=environ, maps=maps),
            "analysis": analysis}


@dataclass(frozen=True)
class Digests:
    size: int
    sha256: str | None     # hex, of the object's bytes (None: not computed, for an object of several parts)
    full_b64: str | None   # the S3 full-object SHA-256 checksum (likewise)
    composite_b64: str     # the S3 multipart (composite) checksum: sha256 of the parts' digests, "-N"

    def checksum(self, part_size: int) -> str:
        """The checksum S3 keeps of the object sent in parts of part_size (one part: the full one)."""
        return self.composite_b64 if self.size > part_size else self.full_b64


class Digester:
    """The SHA-256 of each part_size part of a stream, as S3 checksums a (multipart) upload, and of the whole
    stream unless full=False (one hash pass per byte: an object of one part has its part's digest as its
    full one, an object of several is identified by its composite checksum); fed in order by update()."""

    def __init__(self, part_size: int, full: bool = True):
        self.part_size = part_size
        self._full = hashlib.sha256() if full else None
        self._part = hashlib.sha256()
        self._parts: list[bytes] = []
        self._in_part = 0
        self.size = 0

    def update(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            take = min(len(view), self.part_size - self._in_part)
            self._part.update(view[:take])
            self._in_part += take
            view = view[take:]
            if self._in_part == self.part_size:
                self._parts.append(self._part.digest())
                self._part, self._in_part = hashlib.sha256(), 0
        if self._full is not None:
            self._full.update(data)
        self.size += len(data)

    def result(self) -> Digests:
        parts = self._parts + ([self._part.digest()] if self._in_part else [])
        if self._full is not None:
            return from_parts(self.size, parts, self._full.digest())
        return from_parts(self.size, parts)


def from_parts(size: int, parts: list[bytes], full: bytes | None = None) -> Digests:
    """The digests of an object of `size` bytes from its parts' SHA-256 digests, in order (and its full
    SHA-256 when one was computed; an object of one part has that part's)."""
    composite = base64.b64encode(hashlib.sha256(b"".join(parts)).digest()).decode() + f"-{len(parts)}"
    if full is None and len(parts) <= 1:
        full = parts[0] if parts else hashlib.sha256().digest()
    if full is None:
        return Digests(size, None, None, composite)
    return Digests(size, full.hex(), base64.b64encode(full).decode(), composite)


def digests(path: Path, part_size: int) -> Digests:
    """One read of the file: its SHA-256 and the checksum S3 reports for it sent in parts of part_size."""
    digester = Digester(part_size)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digester.update(chunk)
    return digester.result()


def check_object(head: dict, expect: Digests, *, multipart: bool) -> str | None:
    """Why the HEAD of an uploaded core does not match what was sent, or None when it does. A server that
    keeps no checksums is checked by size only (the sidecar says so: core.verified = "size")."""
    if head.get("ContentLength") != expect.size:
        return f"size {head.get('ContentLength')} in the bucket, {expect.size} sent"
    got = head.get("ChecksumSHA256")
    if got is None:
        return None
    want = expect.composite_b64 if "-" in got else expect.full_b64
    if got != want:
        return f"checksum {got} in the bucket, {want} sent" + (" (multipart)" if multipart else "")
    return None

