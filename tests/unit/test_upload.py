"""The uploader's parts without a real server: backoff, checksums, what leaves the host, the [upload]
config's safety checks, error classes, and fault injection on moto's S3 (an endpoint down for an hour, a
server that ignores conditional creates). The real server's tests are tests/system/test_upload_s3.py."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import random
import threading
import time
from pathlib import Path

import pytest
import zstandard
from botocore.exceptions import ClientError, EndpointConnectionError

from corehandler import capture, paths, spool
from corehandler.config import Config, UploadConfig
from corehandler.errors import ConfigError
from corehandler.fleet import bucket, credentials, payload, transfer, upload
from corehandler.store import upload_queue
from corehandler.store.dumprow import row_from_record
from corehandler.store.index import Store
from support.fleethost import store_with_dump
from support.waiting import wait_for

moto = pytest.importorskip("moto", reason="moto is a test dependency (scripts/pip/test.txt)")


def test_backoff_doubles_with_jitter_up_to_the_cap():
    rand = random.Random(1)
    for attempts in range(1, 30):
        delay = upload.backoff(attempts, 2.0, 600.0, rand)
        full = min(600.0, 2.0 * 2 ** (attempts - 1))
        assert full / 2 <= delay <= full
    assert {round(upload.backoff(20, 2.0, 600.0, random.Random(s))) for s in range(20)} != {600}  # jittered


@pytest.mark.parametrize("size,part", [(0, 5 << 20), (1000, 5 << 20), (5 << 20, 5 << 20), ((5 << 20) + 1, 5 << 20),
                                       (12 << 20, 5 << 20)])
def test_digests_match_the_s3_checksums(tmp_path, size, part):
    data = random.Random(size).randbytes(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    d = payload.digests(path, part)
    assert d.size == size and d.sha256 == hashlib.sha256(data).hexdigest()
    assert d.full_b64 == base64.b64encode(hashlib.sha256(data).digest()).decode()
    parts = [hashlib.sha256(data[i:i + part]).digest() for i in range(0, size, part)]
    assert d.composite_b64 == base64.b64encode(hashlib.sha256(b"".join(parts)).digest()).decode() + f"-{len(parts)}"
    # One hash pass per byte (what the uploader runs): the same checksum S3 keeps, the full digest only where
    # it is the one part's.
    one = payload.Digester(part, full=False)
    for i in range(0, size, 1 << 20):
        one.update(data[i:i + (1 << 20)])
    lean = one.result()
    assert lean.composite_b64 == d.composite_b64 and lean.checksum(part) == d.checksum(part)
    assert (lean.sha256, lean.full_b64) == ((d.sha256, d.full_b64) if size <= part else (None, None))


@pytest.mark.parametrize("size,want", [(0, 16 << 20), (10 << 30, 16 << 20), (160000 << 20, 16 << 20),
                                       ((160000 << 20) + 1, 32 << 20), (1 << 40, 128 << 20)])
def test_parts_grow_to_keep_an_object_within_10000(size, want):
    assert transfer.part_size_for(16 << 20, size) == want
    assert transfer.part_size_for(1 << 20, 0) == transfer.MIN_PART  # S3 refuses smaller parts but the last


def test_a_stream_goes_up_in_one_put_up_to_one_part_and_in_checked_parts_past_it(s3mock):
    part = transfer.MIN_PART
    for size, parts in ((0, 1), (part, 1), (part + 1, 2), (3 * part - 1, 3)):
        data = random.Random(size).randbytes(size)
        got = transfer.send(s3mock, "fleet-test", f"k{size}", io.BytesIO(data), part)
        assert got == payload.from_parts(size, [hashlib.sha256(data[i:i + part]).digest()
                                                for i in range(0, max(size, 1), part)])
        assert s3mock.get_object(Bucket="fleet-test", Key=f"k{size}")["Body"].read() == data
        head = s3mock.head_object(Bucket="fleet-test", Key=f"k{size}", ChecksumMode="ENABLED")
        assert head["ContentLength"] == size and head.get("ETag", "").endswith(f'-{parts}"') == (parts > 1)


def test_an_upload_waits_while_csplice_captures(s3mock, tmp_path):
    """Issue 37: the uploader's parts start only while no capture runs (a fresh .tmp core in the spool)."""
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    running = spool_dir / ".tmp.1796000000000000-0123456789abcdef-9.core"
    running.write_bytes(b"\x7fELF")
    waits = capture.Yield(spool_dir)
    data = random.Random(9).randbytes(transfer.MIN_PART + 1)
    sender = threading.Thread(target=transfer.send,
                              args=(s3mock, "fleet-test", "held", io.BytesIO(data), transfer.MIN_PART),
                              kwargs={"yield_to": lambda longest=None: waits("upload")})
    sender.start()
    try:
        wait_for(lambda: waits.waiting == {"upload": 1}, what="the upload paused")
        assert "Contents" not in s3mock.list_objects_v2(Bucket="fleet-test", Prefix="held")
    finally:
        running.unlink()
    sender.join(30)
    assert s3mock.get_object(Bucket="fleet-test", Key="held")["Body"].read() == data and waits.pauses >= 1


def test_a_part_on_the_wire_stops_within_a_mib_while_csplice_captures_and_never_longer_than_a_server_waits(
        tmp_path, monkeypatch):
    """Issue 37: parts already sent when a crash comes (up to `concurrency` of 16 MiB) would share the CPUs and
    the disk with the capture; the body the HTTP client reads asks the gate every MiB, at most ON_WIRE_WAIT_SEC
    at a time, so a long storm of captures cannot get the request timed out by the server."""
    monkeypatch.setattr(transfer, "ON_WIRE_WAIT_SEC", 0.3)
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    waits = capture.Yield(spool_dir)
    asked = []
    data = random.Random(3).randbytes(3 * transfer.PACE + 5)
    body = transfer.Paced(data, lambda longest=None: (asked.append(longest), waits("upload", longest)))
    assert len(body) == len(data) and body.read(16384) == data[:16384]
    running = spool_dir / ".tmp.1796000000000000-0123456789abcdef-9.core"
    running.write_bytes(b"\x7fELF")
    got, t0 = [body.read(16384)], time.monotonic()
    while len(b"".join(got)) + 16384 < transfer.PACE + 16384 * 2:
        got.append(body.read(16384))
    paused = time.monotonic() - t0
    assert asked == [0.3] and waits.pauses == 1 and 0.25 <= paused < 5  # stopped at the first MiB, not for ever
    running.unlink()
    while block := body.read(16384):
        got.append(block)
    assert asked == [0.3] * 3 and waits.pauses == 1  # a MiB each; the capture ended: the asks go straight on
    assert data[:16384] + b"".join(got) == data
    assert body.seek(0) == 0 and body.tell() == 0 and body.read() == data  # a retry rewinds and sends it all
    assert body.seek(-5, 2) == len(data) - 5 and body.read(100) == data[-5:] and body.read(100) == b""


def test_check_object_compares_size_and_checksum(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    d = payload.digests(path, 5 << 20)
    assert payload.check_object({"ContentLength": 100, "ChecksumSHA256": d.full_b64}, d, multipart=False) is None
    assert payload.check_object({"ContentLength": 100, "ChecksumSHA256": d.composite_b64}, d, multipart=True) is None
    assert "size" in payload.check_object({"ContentLength": 99, "ChecksumSHA256": d.full_b64}, d, multipart=False)
    assert "checksum" in payload.check_object({"ContentLength": 100, "ChecksumSHA256": "AAAA"}, d, multipart=False)
    assert payload.check_object({"ContentLength": 100}, d, multipart=False) is None  # no checksums kept: size
    assert payload.check_object({"ContentLength": 1}, d, multipart=False) is not None


def test_what_capture_keeps_locally_stays_unless_upload_says():
    record = {"id": "x", "proc": {"exe": "/bin/x", "environ": ["SECRET=1"], "maps": "00400000-..."}}
    assert payload.shareable_record(record, environ=False, maps=False)["proc"] == {"exe": "/bin/x"}
    assert payload.shareable_record(record, environ=True, maps=False)["proc"]["environ"] == ["SECRET=1"]
    assert "maps" in payload.shareable_record(record, environ=False, maps=True)["proc"]
    assert record["proc"]["environ"] == ["SECRET=1"]  # the index's copy is untouched


@pytest.mark.parametrize("section,problem", [
    ({"url": "http://bucket"}, "must be s3://"),
    ({"url": "s3://B"}, "bucket must be"),
    ({"url": "s3://fleet/a/../b"}, "'..'"),
    ({"url": "s3://fleet", "endpoint": "http://10.1.2.3:9000"}, "plain http is allowed only on loopback"),
    ({"url": "s3://fleet", "endpoint": "ftp://x"}, "http:// or https://"),
    ({"url": "s3://fleet", "sse_kms_key_id": "k"}, 'needs sse = "aws:kms"'),
    ({"url": "s3://fleet", "credentials_file": "relative"}, "absolute path"),
    ({"url": "s3://fleet", "host": "a/b"}, "host name"),
    ({"url": "s3://fleet", "part_size": "1M"}, "between"),
])
def test_upload_config_refuses(section, problem):
    with pytest.raises(Exception) as err:
        UploadConfig.model_validate(section)
    assert problem in str(err.value)


def test_upload_config_accepts_loopback_http_and_explicit_http():
    assert UploadConfig.model_validate({"url": "s3://fleet/p/", "endpoint": "http://127.0.0.1:8333"}).prefix == "p"
    assert UploadConfig.model_validate({"url": "s3://fleet", "endpoint": "http://[::1]:80"}).bucket == "fleet"
    UploadConfig.model_validate({"url": "s3://fleet", "endpoint": "http://minio.lan:9000", "allow_http": True})
    UploadConfig.model_validate({"url": "s3://fleet", "endpoint": "https://minio.lan:9000"})


def test_defaults_upload_nothing_and_keep_no_budget():
    c = Config()
    assert c.upload.url == "" and c.upload.send == "cores" and c.upload.fleet_budget == 0
    assert not c.upload.send_environ and not c.upload.send_maps and not c.upload.allow_http


def test_a_credentials_or_config_file_others_can_read_is_refused(tmp_path):
    path = tmp_path / "credentials"
    path.write_text("[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n")
    for key in ("credentials_file", "config_file"):
        path.chmod(0o644)
        cfg = UploadConfig.model_validate({"url": "s3://fleet", key: str(path)})
        with pytest.raises(credentials.CredentialsFileError, match=f"upload.{key} .* readable by others.*0644"):
            credentials.botocore_session(cfg)
        path.chmod(0o600)
        credentials.botocore_session(cfg)
    with pytest.raises(credentials.CredentialsFileError, match="No such file"):
        credentials.botocore_session(UploadConfig.model_validate({"url": "s3://fleet",
                                                                  "credentials_file": str(tmp_path / "missing")}))
    cfg = UploadConfig.model_validate({"url": "s3://fleet", "credentials_file": str(path), "profile": "other"})
    with pytest.raises(credentials.CredentialsFileError, match="other"):
        credentials.botocore_session(cfg)


@pytest.mark.parametrize("text", [
    "[default]\naws_access_key_id = AK\naws_secret_access_key SECRET-wJalrXUtnFEMI\n",   # no "="
    "aws_secret_access_key = SECRET-wJalrXUtnFEMI\n[default]\n",                         # before any profile
    "[default]\naws_secret_access_key = SECRET-wJalrXUtnFEMI\naws_secret_access_key = SECRET-2\n",
])
def test_a_malformed_credentials_file_is_named_by_line_never_echoed(tmp_path, caplog, text):
    creds = tmp_path / "credentials"
    creds.write_text(text)
    creds.chmod(0o600)
    with pytest.raises(credentials.CredentialsFileError) as e:
        credentials.botocore_session(UploadConfig.model_validate({"url": "s3://fleet-x",
                                                                  "credentials_file": str(creds)}))
    assert "SECRET" not in e.value.message and "line" in e.value.message, e.value.message
    # ...and so neither in the uploader's log line nor in the queue problem `status` shows
    dump_id = f"{int(time.time() * 1e6)}-0123456789abcdef-7"
    store_with_dump(tmp_path / "state", dump_id, b"x")
    clock = Clock()
    uploader = upload.Uploader(UploadConfig.model_validate({"url": "s3://fleet-x", "credentials_file": str(creds)}),
                               tmp_path / "state", clock=clock)
    with Store(tmp_path / "state") as store:
        for _ in range(3):
            clock.now += uploader.step(store) + 0.001
        st = upload_queue.stats(store.db, clock.now)
    assert st["problem"]["reason"] == "credentials" and "SECRET" not in st["problem"]["message"]
    assert not [r for r in caplog.records if "SECRET" in r.getMessage()]


def test_roots_fleet_cache_is_in_the_state_dir_whatever_home_sudo_kept(tmp_path, monkeypatch):
    from corehandler.fleet import reader

    if os.geteuid() != 0:
        pytest.skip("the rule is root's")
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-home" / ".cache"))
    target = bucket.Target("fleet-test", "p", "h1")
    path = reader.SidecarCache.default_path(target, "http://s3", tmp_path / "state")
    assert path.parent == tmp_path / "state" / "cache" and "user-home" not in str(path)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert reader.SidecarCache.default_path(target, "http://s3", tmp_path / "state").is_relative_to(
        tmp_path / "user-home" / ".cache" / "corehandler")


def _client_error(code: str, status: int = 400) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "PutObject")


@pytest.mark.parametrize("error,reason", [
    (_client_error("InvalidAccessKeyId", 403), "credentials"),
    (_client_error("SignatureDoesNotMatch", 403), "credentials"),
    (_client_error("NoSuchBucket", 404), "bucket"),
    (_client_error("RequestTimeTooSkewed", 403), "clock_skew"),
    (_client_error("SlowDown", 503), "throttled"),
    (_client_error("InternalError", 500), "server"),
    (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), "connection"),
])
def test_errors_are_classified_into_one_line(error, reason):
    err = bucket.classify(error)
    assert err.reason == reason and "\n" not in err.message
    if reason == "clock_skew":
        assert "NTP" in err.message


def test_target_keys():
    t = bucket.Target("fleet", "corp/x", "web-1")
    ts = 1_700_000_000.0  # 2023-11-14 UTC
    assert t.dump_key(ts, "1700000000000000-abc-1", ".zst") == \
        "corp/x/v2/dt=2023-11-14/host=web-1/1700000000000000-abc-1.zst"
    assert t.index_prefix("web-1", bucket.crash_day(ts)) == "corp/x/v2/index/dt=2023-11-14/host=web-1/"
    assert t.v1_day_prefix("web-1", bucket.crash_day(ts)) == "corp/x/v1/web-1/2023/11/14/"
    # The budget stays where 0.2's hosts claim theirs: one budget across a rolling upgrade.
    assert t.budget_slot("sig", "2023-11-14", 2) == "corp/x/v1/budget/sig/2023-11-14/2"
    assert bucket.Target("fleet", "", "h").root() == "v2/" and bucket.Target("fleet", "", "h").root("v1") == "v1/"
    assert bucket.host_of("corp/x/v2/dt=2023-11-14/host=web-1/x.json") == "web-1"
    assert str(bucket.id_day("1700000000000000-abc-1")) == "2023-11-14" and bucket.id_day("nope") is None


# --- fault injection on moto ----------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.now = time.time()

    def __call__(self):
        return self.now


class Flaky:
    """A client that behaves as the endpoint being down until `up_at` (by the test's clock)."""

    def __init__(self, client, clock: Clock, up_at: float, drop_if_none_match: bool = False):
        self.client, self.clock, self.up_at, self.drop = client, clock, up_at, drop_if_none_match
        self.calls = 0

    def __getattr__(self, name):
        attr = getattr(self.client, name)
        if not callable(attr) or name.startswith("get_paginator"):
            return attr

        def call(*args, **kwargs):
            self.calls += 1
            if self.clock() < self.up_at:
                raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9")
            if self.drop:
                kwargs.pop("IfNoneMatch", None)  # a server that ignores the header
            return attr(*args, **kwargs)
        return call


def _drive(uploader: upload.Uploader, store: Store, clock: Clock, until: float) -> None:
    """Runs the uploader's steps, jumping the clock over every wait, until it is done or `until`."""
    while clock.now < until:
        wait = uploader.step(store)
        if store.db.execute("SELECT state FROM uploads").fetchone()[0] == "done":
            return
        clock.now += max(wait, 0.001)


def test_an_endpoint_down_for_an_hour_loses_nothing_and_retries_at_the_backoffs_pace(tmp_path, s3mock):
    clock = Clock()
    dump_id = f"{int(clock.now * 1e6)}-0123456789abcdef-7"
    store_with_dump(tmp_path, dump_id, b"core " * 1000)
    flaky = Flaky(s3mock, clock, up_at=clock.now + 3600)
    cfg = UploadConfig.model_validate({"url": "s3://fleet-test/p", "host": "h1"})
    uploader = upload.Uploader(cfg, tmp_path, client_factory=lambda: flaky, clock=clock)
    with Store(tmp_path) as store:
        _drive(uploader, store, clock, clock.now + 7200)
        st = upload_queue.stats(store.db, clock.now)
    assert st["states"]["done"] == 1 and st["problem"] is None
    # 2 s doubling to the 10 min cap, halved by jitter at worst: some 15 tries in the hour, not thousands.
    assert 8 <= st["failures"]["connection"] <= 25
    keys = sorted(o["Key"] for o in s3mock.list_objects_v2(Bucket="fleet-test")["Contents"])
    assert [k.rsplit(".", 1)[1] for k in keys] == ["json", "zst", "parquet"]  # dt=... then index/


def test_a_server_that_ignores_conditional_creates_gets_every_core(tmp_path, s3mock, caplog):
    clock = Clock()
    cfg = UploadConfig.model_validate({"url": "s3://fleet-test/p", "fleet_budget": 1})
    for n in range(3):
        state = tmp_path / f"h{n}"
        dump_id = f"{int(clock.now * 1e6) + n}-0123456789abcdef-7"
        store_with_dump(state, dump_id, b"same crash " * 100)
        uploader = upload.Uploader(cfg.model_copy(update={"host": f"h{n}"}), state,
                                   client_factory=lambda: Flaky(s3mock, clock, 0, drop_if_none_match=True),
                                   clock=clock)
        with Store(state) as store:
            _drive(uploader, store, clock, clock.now + 60)
    keys = [o["Key"] for o in s3mock.list_objects_v2(Bucket="fleet-test")["Contents"]]
    assert len([k for k in keys if k.endswith(".zst")]) == 3  # nothing kept back on a budget it cannot hold
    sidecars = [json.loads(s3mock.get_object(Bucket="fleet-test", Key=k)["Body"].read()) for k in keys
                if k.endswith(".json")]
    assert {s["budget"] for s in sidecars} == {"unenforced"}
    assert "ignores conditional creates" in caplog.text


def test_retention_deleting_a_waiting_dump_counts_it_lost(tmp_path):
    from corehandler.store import retention

    dump_id = f"{int(time.time() * 1e6)}-0123456789abcdef-7"
    store_with_dump(tmp_path, dump_id, b"x" * 4096)
    with Store(tmp_path) as store:
        # max_count cannot take it while it waits; keep_free (the disk floor) can, and it is then lost.
        assert retention.vacuum(store, retention.Policy(max_count=0 or None, max_use=1)) == []
        deleted = retention.vacuum(store, retention.Policy(keep_free=1 << 62))
        assert [d.id for d in deleted] == [dump_id]
        st = upload_queue.stats(store.db)
    assert st["states"]["failed"] == 1 and st["failures"] == {"lost": 1}


def test_a_dump_queued_before_its_row_is_committed_waits_for_the_commit(tmp_path, s3mock):
    """daemon.py announces a row just before committing it: on_stored queues a dump whose row is still
    `compressing`, on_ingested (a final status) one not inserted yet, its record still in the spool. Neither
    is an attempt nor lost: the uploader looks again and sends both once committed. A queued dump with
    neither row nor record was deleted: lost."""
    clock = Clock()
    compressing, uninserted, deleted = (f"{int(clock.now * 1e6) + n}-0123456789abcdef-7" for n in range(3))
    data = b"core " * 1000
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / f"{compressing}.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    spool_dir = paths.spool_dir(tmp_path)
    spool_dir.mkdir()
    records = {i: {"id": i, "signal": 6, "timestamp": clock.now, "proc": {"exe": "/usr/bin/x"}, "capture": {}}
               for i in (compressing, uninserted, deleted)}
    spool.record_path(spool_dir, uninserted).write_text(json.dumps(records[uninserted]))
    with Store(tmp_path) as store:
        store.insert(row_from_record(records[compressing], status="compressing", problem=None, path=None,
                                     raw_bytes=len(data), stored_bytes=0, sha256=None))
    cfg = UploadConfig.model_validate({"url": "s3://fleet-test/p", "host": "h1"})
    uploader = upload.Uploader(cfg, tmp_path, client_factory=lambda: s3mock, clock=clock)
    try:
        for dump_id, record in records.items():
            uploader.on_stored(record, {"id": dump_id, "status": "ok"})
        with Store(tmp_path) as store:
            for _ in range(5):
                clock.now += uploader.step(store) + 0.001
            st = upload_queue.stats(store.db, clock.now)
            assert (st["states"]["pending"], st["states"]["failed"], st["failures"]) == (2, 1, {"lost": 1})
            assert {r[0] for r in store.db.execute("SELECT attempts FROM uploads WHERE state = 'pending'")} == {0}
            # The daemon's commits, late as a kill and a restart can make them.
            store.complete(compressing, status="ok", path=f"{compressing}.zst", raw_bytes=len(data),
                           sha256=hashlib.sha256(data).hexdigest())
            store.insert(row_from_record(records[uninserted], status="dropped", problem=None, path=None,
                                         raw_bytes=0, stored_bytes=0, sha256=None))
            for _ in range(10):
                clock.now += uploader.step(store) + 0.001
            st = upload_queue.stats(store.db, clock.now)
        assert (st["states"]["done"], st["states"]["pending"]) == (2, 0)
        assert sorted(k.rsplit(".", 1)[1] for k in _objects(s3mock, "p/")) == ["json", "json", "zst"]
    finally:
        uploader.close()


def _objects(client, prefix: str) -> list[str]:
    """The dumps' objects (not the index files) under prefix."""
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket="fleet-test", Prefix=prefix).get("Contents", [])
                  if "/index/" not in o["Key"])


def test_a_reload_moves_turns_off_and_turns_on_the_uploader_thread(tmp_path, s3mock):
    """What SIGHUP does to [upload] (cli/serve.py passes the new section): the running thread takes it between
    two uploads. Off: nothing is queued, what waited leaves the queue so retention governs it again; on:
    the store's dumps are queued again (backfill), under the new settings."""
    from corehandler.store import retention

    first = f"{int(time.time() * 1e6)}-0123456789abcdef-7"
    store_with_dump(tmp_path, first, b"first " * 100)
    on = UploadConfig.model_validate({"url": "s3://fleet-test/a", "host": "h1", "retry_initial": "10ms"})
    uploader = upload.Uploader(on, tmp_path, client_factory=lambda: s3mock).start()
    try:
        wait_until(lambda: len(_objects(s3mock, "a/")) == 2)

        # Moved: the next dump goes under the new prefix, the first stays where it went.
        uploader.reconfigure(on.model_copy(update={"url": "s3://fleet-test/b"}))
        second = _insert_and_ingest(tmp_path, uploader, b"second " * 100, 8)
        wait_until(lambda: len(_objects(s3mock, "b/")) == 2)
        assert all(second in k for k in _objects(s3mock, "b/"))

        # Off: a dump ingested now is not queued, and one already waiting leaves the queue.
        off = UploadConfig.model_validate({"url": ""})
        with Store(tmp_path) as store:
            upload_queue.enqueue(store.db, "1-0123456789abcdef-1")  # a row still waiting when uploads go off
        uploader.reconfigure(off)
        third = _insert_and_ingest(tmp_path, uploader, b"third " * 100, 9)
        with Store(tmp_path) as store:
            wait_until(lambda: upload_queue.waiting_ids(store.db) == set())
            assert store.db.execute("SELECT id FROM uploads WHERE id = ?", (third,)).fetchone() is None
            # Nothing waits, so max_count may take the oldest dump again.
            assert [d.id for d in retention.vacuum(store, retention.Policy(max_count=2))] == [first]

        # On again: the dump ingested while off goes up.
        uploader.reconfigure(on.model_copy(update={"url": "s3://fleet-test/c"}))
        wait_until(lambda: any(third in k for k in _objects(s3mock, "c/")))
    finally:
        uploader.close()


def test_the_latest_reload_wins_before_the_thread_takes_it(tmp_path):
    """Off then back on before the thread looked: the running section is what is pending (its client is
    renewed, nothing else changes) and dumps keep being queued; off alone stops queuing at once."""
    on = UploadConfig.model_validate({"url": "s3://fleet-test/a", "host": "h1"})
    uploader = upload.Uploader(on, tmp_path)
    with Store(tmp_path) as store:
        uploader.reconfigure(UploadConfig.model_validate({"url": ""}))
        uploader.on_ingested({}, {"id": "1-0123456789abcdef-1"})
        assert upload_queue.stats(store.db) is None  # off counts before the thread takes it
        uploader.reconfigure(on)
        assert uploader._reconfigured == on and uploader._take_reconfigured() and uploader.config == on
        uploader.on_ingested({}, {"id": "1-0123456789abcdef-2"})
        assert upload_queue.waiting_ids(store.db) == {"1-0123456789abcdef-2"}
    uploader.close()


def test_uploads_that_were_never_on_leave_no_queue(tmp_path):
    """The daemon always runs the uploader (a reload may turn it on); off, it must not make the queue, or
    `status` would report "queue left from an earlier [upload]" on a host that never uploaded."""
    uploader = upload.Uploader(UploadConfig.model_validate({"url": ""}), tmp_path)
    with Store(tmp_path) as store:
        uploader._recover(store)
        assert upload_queue.stats(store.db) is None
        uploader.on_ingested({}, {"id": "1-0123456789abcdef-1"})
        assert upload_queue.stats(store.db) is None


def _insert_and_ingest(state: Path, uploader: upload.Uploader, payload: bytes, n: int) -> str:
    """A dump indexed as the daemon does, then handed to the uploader as the daemon's on_ingested does."""
    dump_id = f"{int(time.time() * 1e6)}-0123456789abcdef-{n}"
    (state / "store" / f"{dump_id}.zst").write_bytes(zstandard.ZstdCompressor().compress(payload))
    record = {"id": dump_id, "signal": 6, "timestamp": time.time(), "proc": {"exe": "/usr/bin/x"}, "capture": {}}
    with Store(state) as store:
        store.insert(row_from_record(record, status="ok", problem=None, path=f"{dump_id}.zst", raw_bytes=len(payload),
                                     stored_bytes=0, sha256=hashlib.sha256(payload).hexdigest()))
    uploader.on_ingested(record, {"id": dump_id})
    return dump_id


def wait_until(condition, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_config_error_names_the_upload_key(tmp_path):
    from corehandler.config import load_config
    from corehandler.paths import Paths

    (tmp_path / "corehandler.toml").write_text('[upload]\nurl = "s3://fleet"\nendpoint = "http://192.0.2.1"\n')
    with pytest.raises(ConfigError, match="upload.*plain http"):
        load_config(Paths(config_dir=tmp_path))


def _fleet_cli(tmp_path, capsys, upload_toml: str, *args: str) -> tuple[int, str]:
    from corehandler.cli import main

    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "corehandler.toml").write_text(upload_toml)
    capsys.readouterr()
    code = main(["--config-dir", str(etc), "--state-dir", str(tmp_path / "state"), "fleet", *args])
    return code, capsys.readouterr().err


def test_fleet_without_a_bucket_says_how_to_configure_one(tmp_path, capsys):
    code, err = _fleet_cli(tmp_path, capsys, "", "list")
    assert code == 3 and err.count("\n") == 1 and 'upload.url = "s3://BUCKET/PREFIX"' in err


def test_fleet_refuses_a_credentials_file_others_can_read(tmp_path, capsys):
    creds = tmp_path / "credentials"
    creds.write_text("[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n")
    creds.chmod(0o640)
    code, err = _fleet_cli(tmp_path, capsys, f'[upload]\nurl = "s3://fleet-x"\ncredentials_file = "{creds}"\n',
                           "list")
    assert code == 4 and err.count("\n") == 1 and "readable by others (mode 0640" in err


def test_the_uploader_reports_an_unsafe_credentials_file_as_the_queue_problem(tmp_path, caplog):
    creds = tmp_path / "credentials"
    creds.write_text("[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n")
    creds.chmod(0o604)
    dump_id = f"{int(time.time() * 1e6)}-0123456789abcdef-7"
    store_with_dump(tmp_path / "state", dump_id, b"x")
    cfg = UploadConfig.model_validate({"url": "s3://fleet-x", "credentials_file": str(creds)})
    clock = Clock()
    uploader = upload.Uploader(cfg, tmp_path / "state", clock=clock)
    with Store(tmp_path / "state") as store:
        for _ in range(5):
            clock.now += uploader.step(store) + 0.001
        st = upload_queue.stats(store.db, clock.now)
    assert st["problem"]["reason"] == "credentials" and "readable by others" in st["problem"]["message"]
    assert st["states"]["pending"] == 1
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1


def test_fleet_list_reads_each_sidecar_once_and_again_when_it_changes(tmp_path, s3mock, s3gets):
    from corehandler.fleet import reader

    target = bucket.Target("fleet-test", "p", "h1")
    now = time.time()
    keys = [target.dump_key(now, f"{int(now * 1e6) + i}-0123456789abcdef-{i}", ".json", f"h{i % 2}") for i in range(5)]
    for i, key in enumerate(keys):
        s3mock.put_object(Bucket="fleet-test", Key=key,
                          Body=json.dumps({"schema": 2, "id": str(i), "crashed_at": now + i}).encode())
    gets = s3gets
    cache = reader.SidecarCache(tmp_path / "cache" / "fleet.sqlite")
    day = bucket.crash_day(now)
    first, skipped = reader.list_sidecars(s3mock, target, [day], cache=cache)
    assert [s["id"] for s in first] == ["0", "1", "2", "3", "4"] and len(gets) == 5 and skipped == []
    gets.clear()
    again, _ = reader.list_sidecars(s3mock, target, [day], cache=cache)
    assert [s["id"] for s in again] == ["0", "1", "2", "3", "4"] and gets == []
    s3mock.put_object(Bucket="fleet-test", Key=keys[2],
                      Body=json.dumps({"schema": 2, "id": "2b", "crashed_at": now + 2}).encode())
    third, _ = reader.list_sidecars(s3mock, target, [day], cache=cache)
    assert gets == [keys[2]] and [s["id"] for s in third] == ["0", "1", "2b", "3", "4"]
    assert (tmp_path / "cache" / "fleet.sqlite").stat().st_mode & 0o077 == 0
    cache.close()


def test_a_sidecar_not_json_or_of_a_newer_schema_is_skipped_and_named(tmp_path, s3mock):
    from corehandler.fleet import reader

    target = bucket.Target("fleet-test", "p", "h1")
    now = time.time()
    good, garbage, future = (target.dump_key(now, f"{int(now * 1e6) + i}-0123456789abcdef-{i}", ".json")
                             for i in range(3))
    s3mock.put_object(Bucket="fleet-test", Key=good, Body=json.dumps({"schema": 1, "id": "good"}).encode())
    s3mock.put_object(Bucket="fleet-test", Key=garbage, Body=b"\x00not json")
    s3mock.put_object(Bucket="fleet-test", Key=future, Body=json.dumps({"schema": 99, "id": "future"}).encode())
    found, skipped = reader.list_sidecars(s3mock, target, [bucket.crash_day(now)])
    assert [s["id"] for s in found] == ["good"]
    assert len(skipped) == 2
    assert any(garbage in s and "not a JSON sidecar" in s for s in skipped)
    assert any(future in s and "schema 99" in s for s in skipped)
