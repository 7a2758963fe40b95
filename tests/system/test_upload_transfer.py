"""What one upload costs the client, against the real S3 server (SeaweedFS weed mini on loopback): every byte
of the core is hashed once, by the uploader, and the server checks it against that digest (botocore hashes
none of it again, for a checksum or for the signature); the upload makes no request it does not need; and a
part whose bytes do not match its digest is still refused. bench/upload.py measures what this saves."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import time

import botocore.auth
import botocore.httpchecksum
import pytest
from pyrage import x25519

from corehandler.config import UploadConfig
from corehandler.fleet import upload
from corehandler.store.index import Store
from support.fleethost import dump_keys, store_with_dump, upload_config

pytestmark = pytest.mark.s3

PART = 5 << 20


def _host(tmp_path, s3, size: int, **over) -> tuple[upload.Uploader, str, str]:
    """An uploader of a store holding one dump of `size` incompressible bytes, with its own bucket."""
    bucket = s3.new_bucket()
    cfg = UploadConfig.model_validate(upload_config(s3, bucket, tmp_path, part_size="5M", **over))
    dump_id = f"{int(time.time() * 1e6)}-0123456789abcdef-7"
    store_with_dump(tmp_path / "state", dump_id, os.urandom(size))
    uploader = upload.Uploader(cfg, tmp_path / "state")
    uploader._client = uploader._client_factory()
    return uploader, bucket, dump_id


class Wire:
    """The requests a client sends, as they leave it (after signing): [(operation, headers, body)]."""

    def __init__(self, client):
        self.sent: list[tuple[str, dict, bytes]] = []
        client.meta.events.register("before-send.s3", self._record)

    def _record(self, request, event_name: str, **_) -> None:
        headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        self.sent.append((event_name.rsplit(".", 1)[1], headers, body_of(request)))

    def ops(self) -> list[str]:
        return [op for op, _, _ in self.sent]


@pytest.fixture
def botocore_hashed(monkeypatch) -> list[int]:
    """Sizes of what botocore hashes from now on: its request checksums and its SigV4 payload hashes."""
    sizes: list[int] = []
    for cls in set(botocore.httpchecksum._CHECKSUM_CLS.values()):
        real_update = cls.update

        def update(self, chunk, _real=real_update):
            sizes.append(len(chunk))
            return _real(self, chunk)
        monkeypatch.setattr(cls, "update", update)
    real_sha256 = botocore.auth.sha256

    def counting_sha256(data=b""):
        sizes.append(len(data))
        return real_sha256(data)
    monkeypatch.setattr(botocore.auth, "sha256", counting_sha256)
    return sizes


def body_of(request) -> bytes:
    """A request's body as it is about to be sent (botocore hands PUT bodies over as files)."""
    body = request.body
    if hasattr(body, "read"):
        at = body.tell()
        data = body.read()
        body.seek(at)
        return data
    return bytes(body or b"")


def _row(uploader: upload.Uploader, dump_id: str) -> tuple:
    with Store(uploader.state_dir, readonly=True) as store:
        return store.db.execute("SELECT state, attempts, last_error FROM uploads WHERE id = ?", (dump_id,)).fetchone()


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "age"])
def test_each_byte_of_a_core_is_hashed_once_and_the_server_checks_that_digest(tmp_path, s3, botocore_hashed,
                                                                              encrypted):
    recipients = [str(x25519.Identity.generate().to_public())] if encrypted else []
    uploader, bucket, dump_id = _host(tmp_path, s3, 12 << 20, recipients=recipients)
    wire = Wire(uploader._client)
    with Store(uploader.state_dir) as store:
        assert uploader.upload_one(store, dump_id)
    parts = [(headers, body) for op, headers, body in wire.sent if op == "UploadPart"]
    assert len(parts) == 3  # 12 MiB and a bit in parts of 5 MiB
    for headers, body in parts:
        assert headers["x-amz-checksum-sha256"] == base64.b64encode(hashlib.sha256(body).digest()).decode()
        assert headers["X-Amz-Content-SHA256"] == "UNSIGNED-PAYLOAD"  # the signed checksum covers the body
        assert not [h for h in headers if h.lower().startswith("x-amz-checksum-") and h != "x-amz-checksum-sha256"]
    # botocore hashed the requests it signed and the small bodies (sidecar, index), none of the core's bytes.
    assert sum(botocore_hashed) < 1 << 20, sum(botocore_hashed)
    (core_key,) = [k for k in dump_keys(s3, bucket, dump_id) if not k.endswith(".json")]
    head = s3.client().head_object(Bucket=bucket, Key=core_key, ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"].endswith("-3")


def test_an_upload_makes_the_requests_it_needs_and_a_retry_looks_for_the_core_first(tmp_path, s3):
    uploader, bucket, dump_id = _host(tmp_path, s3, 12 << 20)
    wire = Wire(uploader._client)
    with Store(uploader.state_dir) as store:
        assert uploader.upload_one(store, dump_id)
        # A first attempt cannot find a core of its own in the bucket: no HEAD before the transfer.
        assert wire.ops() == ["CreateMultipartUpload", "UploadPart", "UploadPart", "UploadPart",
                              "CompleteMultipartUpload", "HeadObject",    # the core, verified
                              "PutObject",                                # the sidecar
                              "ListObjectsV2", "PutObject"]  # the day's index file (a day held nowhere yet)
        # A retry (a kill after the core went up, before the row noted it) finds it and does not send it again.
        store.db.execute("UPDATE uploads SET state = 'pending', core = NULL WHERE id = ?", (dump_id,))
        store.db.commit()
        wire.sent.clear()
        assert uploader.upload_one(store, dump_id, attempts=1)
        # The index part's rows come from the state dir: nothing of the bucket's is read or listed.
        assert wire.ops() == ["HeadObject", "PutObject", "PutObject"]


@pytest.mark.parametrize("size", [1 << 20, 12 << 20], ids=["one PUT", "multipart"])
def test_a_part_whose_bytes_do_not_match_its_digest_is_refused(tmp_path, s3, size):
    uploader, bucket, dump_id = _host(tmp_path, s3, size)
    op = "PutObject" if size < PART else "UploadPart"
    flipped = []

    def corrupt(request, **_):
        body = bytearray(body_of(request))
        if flipped or not body:
            return
        body[len(body) // 2] ^= 0x01  # a bit flipped on the way: what the server must catch
        request.body = io.BytesIO(bytes(body))
        flipped.append(True)
    uploader._client.meta.events.register(f"before-send.s3.{op}", corrupt)
    with Store(uploader.state_dir) as store:
        assert not uploader.upload_one(store, dump_id)
    state, attempts, error = _row(uploader, dump_id)
    assert flipped and state == "pending" and attempts == 1
    assert op in error  # the server refused the request, not a later check
    assert dump_keys(s3, bucket, dump_id) == [] and s3.multipart_uploads(bucket) == []  # nothing half there
    uploader._client.meta.events.unregister(f"before-send.s3.{op}", corrupt)
    with Store(uploader.state_dir) as store:
        assert uploader.upload_one(store, dump_id, attempts=1)
    assert len(dump_keys(s3, bucket, dump_id)) == 2
