"""Uploads into a real S3 server (SeaweedFS weed mini on loopback) and the fleet view reading them back:
records made by csplice from the feeder, ingested by the real daemon, uploaded by its uploader thread."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pyrage import x25519

from corehandler.config import UploadConfig
from corehandler.errors import EXIT_SYSTEM
from corehandler.fleet import upload
from corehandler.fleet.bucket import client as bucket_client
from corehandler.store import upload_queue
from corehandler.store.index import Store
from corehandler.testpause import UPLOAD_ENV
from support.daemon_harness import Running, wait_for
from support.fleethost import Host, dump_keys, sha_file

pytestmark = pytest.mark.s3

RUNDAEMON = Path(__file__).parent.parent / "support" / "rundaemon.py"


def test_a_dump_goes_up_verified_and_comes_back_byte_identical(tmp_path, s3, feeder, csplice, capsys):
    bucket = s3.new_bucket()
    host = Host(tmp_path, s3, bucket)
    record = host.crash(feeder, csplice, size=3 << 20)
    host.upload_all()
    day = time.strftime("%Y-%m-%d", time.gmtime(int(record["id"].split("-")[0]) / 1e6))
    base = f"fleet/v2/dt={day}/host=alpha/{record['id']}"
    assert dump_keys(s3, bucket, record["id"]) == [base + ".json", base + ".zst"]
    sidecar = json.loads(s3.client().get_object(Bucket=bucket, Key=base + ".json")["Body"].read())
    assert sidecar["id"] == record["id"] and sidecar["host"] == "alpha"
    assert sidecar["core"]["key"] == base + ".zst" and sidecar["core"]["raw_sha256"] == record["_sha256"]
    assert sidecar["sha256"] == record["_sha256"]
    assert sidecar["mini"]["key"] == base + ".mini.core" in s3.keys(bucket, "fleet/v2/dt=")
    assert sidecar["record"]["capture"] == record["capture"] and sidecar["index"]["status"] == "ok"
    head = s3.client().head_object(Bucket=bucket, Key=base + ".zst", ChecksumMode="ENABLED")
    assert head["ContentLength"] == sidecar["core"]["bytes"]

    code, out, _ = host.cli(capsys, "fleet", "list", "--days", "2", "--json")
    assert code == 0
    assert [(r["id"], r["host"], r["core"]) for r in json.loads(out)] == [(record["id"], "alpha", True)]
    out_file = tmp_path / "back.core"
    code, _, err = host.cli(capsys, "fleet", "get", record["id"], "-o", str(out_file))
    assert code == 0, err
    assert sha_file(out_file) == record["_sha256"]
    assert "\r" not in err  # no progress bar off a terminal
    code, out, _ = host.cli(capsys, "fleet", "info", record["id"], "--json")
    assert code == 0 and json.loads(out)["core"]["raw_sha256"] == record["_sha256"]
    code, out, _ = host.cli(capsys, "status")
    assert "upload:" in out and "0 waiting, 1 done, 0 failed" in out


def test_a_core_over_64_mib_goes_up_in_parts(tmp_path, s3, feeder, csplice, capsys):
    bucket = s3.new_bucket()
    host = Host(tmp_path, s3, bucket, compression=False, part_size="16M")
    record = host.crash(feeder, csplice, size=72 << 20)
    host.upload_all(timeout=120)
    (core_key, sidecar_key) = dump_keys(s3, bucket, record["id"])
    assert core_key.endswith(".core") and sidecar_key.endswith(".json")
    head = s3.client().head_object(Bucket=bucket, Key=core_key, ChecksumMode="ENABLED")
    assert head["ContentLength"] == 72 << 20
    assert head["ChecksumSHA256"].endswith("-5") and head["ETag"].endswith('-5"')  # 4 parts of 16M and one of 8M
    out_file = tmp_path / "back.core"
    assert host.cli(capsys, "fleet", "get", record["id"], "-o", str(out_file))[0] == 0
    assert sha_file(out_file) == record["_sha256"]


def _wait_multipart(s3, bucket: str, timeout: float = 60) -> None:
    wait_for(lambda: s3.multipart_uploads(bucket), what="a multipart upload in progress", timeout=timeout)


def test_server_stopped_mid_multipart_and_restarted(tmp_path, s3_private, feeder, csplice, capsys):
    s3 = s3_private
    bucket = s3.new_bucket()
    # Slow enough to be caught mid-way: 40 MiB in 5 MiB parts at 8 MiB/s.
    host = Host(tmp_path, s3, bucket, compression=False, part_size="5M", concurrency=1, bandwidth_limit="8M")
    record = host.crash(feeder, csplice, size=40 << 20)
    uploader = host.uploader()
    with Running(host.settings, [uploader]):
        _wait_multipart(s3, bucket)
        s3.stop(signal.SIGKILL)
        wait_for(lambda: (host.queue() or {}).get("problem") is not None, what="the failure noticed", timeout=60)
        assert host.queue()["problem"]["reason"] == "connection"
        s3.start()
        wait_for(lambda: host.done() == 1, what="the dump uploaded after the restart", timeout=120)
    assert len(dump_keys(s3, bucket, record["id"])) == 2
    assert s3.multipart_uploads(bucket) == []  # the interrupted one aborted, not left to rot
    st = host.queue()
    assert st["problem"] is None and st["failures"].get("connection", 0) >= 1
    out_file = tmp_path / "back.core"
    assert host.cli(capsys, "fleet", "get", record["id"], "-o", str(out_file))[0] == 0
    assert sha_file(out_file) == record["_sha256"]


def _rundaemon(host: Host, pause: str | None = None) -> subprocess.Popen:
    config = host.root / "uploader.json"
    config.write_text(json.dumps(host.upload))
    env = dict(os.environ)
    if pause:
        env[UPLOAD_ENV] = pause
    return subprocess.Popen([sys.executable, str(RUNDAEMON), str(host.state), "--threads", "1",
                             *([] if host.settings.compression else ["--no-compression"]), "--upload", str(config)],
                            env=env, stdout=subprocess.DEVNULL, stderr=open(host.root / "daemon.log", "ab"))


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)


def _run_until_done(host: Host, n: int = 1) -> None:
    proc = _rundaemon(host)
    try:
        wait_for(lambda: host.done() == n, what="the uploads done", timeout=120)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_daemon_sigkilled_mid_multipart_leaves_exactly_one_core_and_sidecar(tmp_path, s3, feeder, csplice, capsys):
    bucket = s3.new_bucket()
    host = Host(tmp_path, s3, bucket, compression=False, part_size="5M", concurrency=1, bandwidth_limit="8M")
    record = host.crash(feeder, csplice, size=40 << 20)
    proc = _rundaemon(host)
    try:
        _wait_multipart(s3, bucket)
    finally:
        _kill(proc)
    assert len(s3.multipart_uploads(bucket)) == 1  # what the kill left
    assert host.queue()["states"]["uploading"] == 1
    _run_until_done(host)
    assert len(dump_keys(s3, bucket, record["id"])) == 2
    assert s3.multipart_uploads(bucket) == []
    out_file = tmp_path / "back.core"
    assert host.cli(capsys, "fleet", "get", record["id"], "-o", str(out_file))[0] == 0
    assert sha_file(out_file) == record["_sha256"]


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "age"])
def test_daemon_sigkilled_between_core_and_sidecar_does_not_send_the_core_twice(tmp_path, s3, feeder, csplice,
                                                                                encrypted):
    bucket = s3.new_bucket()
    recipients = [str(x25519.Identity.generate().to_public())] if encrypted else []
    host = Host(tmp_path, s3, bucket, recipients=recipients)
    record = host.crash(feeder, csplice, size=2 << 20)
    proc = _rundaemon(host, pause="core_sent")
    try:
        wait_for(lambda: "Pausing at core_sent" in (host.root / "daemon.log").read_text(), what="the core up",
                 timeout=60)
    finally:
        _kill(proc)
    (core_key,) = dump_keys(s3, bucket, record["id"])
    first = s3.client().head_object(Bucket=bucket, Key=core_key)["LastModified"]
    time.sleep(1.1)  # LastModified has whole seconds
    _run_until_done(host)
    keys = dump_keys(s3, bucket, record["id"])
    assert [k.split(".", 1)[1] for k in keys] == ["json", "zst.age" if encrypted else "zst"]
    assert s3.client().head_object(Bucket=bucket, Key=core_key)["LastModified"] == first  # not sent again
    with Store(host.state, readonly=True) as store:
        attempts, sent = store.db.execute("SELECT attempts, bytes FROM uploads").fetchone()
    assert attempts == 2 and sent < 1 << 20  # the second attempt sent the sidecar only


@pytest.mark.parametrize("fault,reason", [("wrong_credentials", "credentials"), ("missing_bucket", "bucket")])
def test_a_misconfigured_bucket_is_one_clear_line_not_a_retry_storm(tmp_path, s3, feeder, csplice, capsys, caplog,
                                                                    fault, reason):
    bucket = s3.new_bucket() if fault == "wrong_credentials" else "fleet-no-such-bucket"
    host = Host(tmp_path, s3, bucket)
    if fault == "wrong_credentials":
        s3.credentials_file(Path(host.upload["credentials_file"]), secret="not-the-secret")
    for i in range(3):
        host.crash(feeder, csplice, size=1 << 16, pid=500 + i, keep_core=False)
    caplog.set_level(logging.INFO, logger="corehandler.fleet.upload")
    with Running(host.settings, [host.uploader()]):
        wait_for(lambda: host.failures() >= 3, what="a few failed attempts", timeout=60)
    st = host.queue()
    assert st["problem"]["reason"] == reason
    assert st["states"]["pending"] == 3 and st["states"]["done"] == 0  # nothing lost, nothing given up
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and reason in errors[0].getMessage()  # said once, however often it was tried
    code, out, _ = host.cli(capsys, "status")
    status = next(line for line in out.splitlines() if line.startswith("upload:"))
    assert f"FAILING ({reason})" in status and "3 waiting" in status


def test_fleet_get_detects_a_corrupt_object(tmp_path, s3, feeder, csplice, capsys):
    bucket = s3.new_bucket()
    host = Host(tmp_path, s3, bucket)
    record = host.crash(feeder, csplice, size=1 << 20)
    host.upload_all()
    core_key = next(k for k in dump_keys(s3, bucket, record["id"]) if k.endswith(".zst"))
    body = bytearray(s3.client().get_object(Bucket=bucket, Key=core_key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.client().put_object(Bucket=bucket, Key=core_key, Body=bytes(body))
    out_file = tmp_path / "back.core"
    code, _, err = host.cli(capsys, "fleet", "get", record["id"], "-o", str(out_file))
    assert code == EXIT_SYSTEM and "corrupt" in err
    assert not out_file.exists() and os.listdir(tmp_path).count("back.core") == 0
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no temp file left


def _crash_both(tmp_path, s3, bucket, feeder, csplice, **upload_over) -> tuple[Host, Host, list[dict]]:
    alpha = Host(tmp_path, s3, bucket, "alpha", **upload_over)
    beta = Host(tmp_path, s3, bucket, "beta", **upload_over)
    records = [alpha.crash(feeder, csplice, size=1 << 20, pid=1001),
               beta.crash(feeder, csplice, size=1 << 20, pid=1002)]
    with Running(alpha.settings, [alpha.uploader()]), Running(beta.settings, [beta.uploader()]):
        wait_for(lambda: alpha.done() == 1 and beta.done() == 1, what="both hosts' uploads")
    return alpha, beta, records


def test_two_hosts_are_seen_together_grouped_by_signature(tmp_path, s3, feeder, csplice, capsys):
    bucket = s3.new_bucket()
    alpha, beta, records = _crash_both(tmp_path, s3, bucket, feeder, csplice)
    code, out, _ = alpha.cli(capsys, "fleet", "list", "--days", "2", "--json")
    assert sorted((r["host"], r["id"]) for r in json.loads(out)) == \
        sorted([("alpha", records[0]["id"]), ("beta", records[1]["id"])])
    code, out, _ = beta.cli(capsys, "fleet", "list", "--days", "2", "--group", "--json")
    (group,) = json.loads(out)
    assert group["count"] == 2 and group["cores"] == 2 and group["hosts"] == ["alpha", "beta"]
    assert group["first_seen"] <= group["last_seen"]
    code, out, _ = beta.cli(capsys, "fleet", "list", "--days", "2", "--group")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["COUNT", "CORES", "HOSTS"]


def test_the_fleet_budget_keeps_one_core_when_both_hosts_crash_the_same_way(tmp_path, s3, feeder, csplice, capsys):
    bucket = s3.new_bucket()
    alpha, beta, records = _crash_both(tmp_path, s3, bucket, feeder, csplice, fleet_budget=1)
    cores = [k for k in s3.keys(bucket, "fleet/v2/dt=") if k.endswith(".zst")]
    sidecars = [k for k in s3.keys(bucket, "fleet/v2/dt=") if k.endswith(".json")]
    assert len(cores) == 1 and len(sidecars) == 2
    budgets = sorted(json.loads(s3.client().get_object(Bucket=bucket, Key=k)["Body"].read())["budget"]
                     for k in sidecars)
    assert budgets == ["kept_back", "slot 0"]
    assert alpha.queue()["kept_back"] + beta.queue()["kept_back"] == 1
    code, out, _ = alpha.cli(capsys, "fleet", "list", "--days", "2", "--group", "--json")
    (group,) = json.loads(out)
    assert group["count"] == 2 and group["cores"] == 1
    listed = json.loads(alpha.cli(capsys, "fleet", "list", "--days", "2", "--json")[1])
    kept_back = next(r for r in listed if not r["core"])
    code, _, err = alpha.cli(capsys, "fleet", "get", kept_back["id"], "-o", str(tmp_path / "x"))
    assert code != 0 and "no core in the bucket" in err
    # ... but its mini core went up, as every dump's did, and comes back as the host stored it
    minis = [k for k in s3.keys(bucket, "fleet/v2/dt=") if k.endswith(".mini.core")]
    assert len(minis) == 2
    code, _, err = alpha.cli(capsys, "fleet", "get", "--mini", kept_back["id"], "-o", str(tmp_path / "mini"))
    assert code == 0, err
    host = alpha if kept_back["host"] == "alpha" else beta
    with Store(host.settings.state_dir) as store:
        stored = store.mini_path(store.get(kept_back["id"])).read_bytes()
    assert (tmp_path / "mini").read_bytes() == stored and stored[:4] == b"\x7fELF"


def test_concurrent_conditional_creates_of_one_key_have_one_winner(s3):
    """The budget's premise, checked on this server: If-None-Match: * is atomic under concurrent puts."""
    from botocore.exceptions import ClientError

    bucket = s3.new_bucket()
    client = s3.client()
    for round_ in range(2):
        key = f"race/{round_}"
        start = threading.Barrier(64)

        def put(i):
            start.wait()
            try:
                client.put_object(Bucket=bucket, Key=key, Body=str(i).encode(), IfNoneMatch="*")
                return i
            except ClientError as e:
                assert e.response["Error"]["Code"] == "PreconditionFailed"
                return None

        threads_out = []
        workers = [threading.Thread(target=lambda i=i: threads_out.append(put(i))) for i in range(64)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        winners = [i for i in threads_out if i is not None]
        assert len(winners) == 1
        assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == str(winners[0]).encode()


def _fake_host_store(state: Path, dump_id: str, payload: bytes) -> None:
    """A state dir whose index holds one stored dump of exe /usr/bin/crasher, signal 11."""
    import zstandard

    from corehandler.store.dumprow import row_from_record

    (state / "store").mkdir(parents=True)
    (state / "store" / f"{dump_id}.zst").write_bytes(zstandard.ZstdCompressor().compress(payload))
    record = {"id": dump_id, "signal": 11, "timestamp": time.time(), "proc": {"exe": "/usr/bin/crasher"},
              "capture": {}}
    with Store(state) as store:
        store.insert(row_from_record(record, status="ok", problem=None, path=f"{dump_id}.zst",
                                     raw_bytes=len(payload), stored_bytes=0,
                                     sha256=hashlib.sha256(payload).hexdigest()))
        upload_queue.ensure_schema(store.db)
        upload_queue.enqueue(store.db, dump_id)


def test_a_simulated_fleet_racing_for_one_signature_leaves_exactly_n_cores(tmp_path, s3):
    bucket = s3.new_bucket()
    hosts, budget = 200, 3
    creds = s3.credentials_file(tmp_path / "credentials")
    base = {"url": f"s3://{bucket}/fleet", "endpoint": s3.endpoint, "credentials_file": str(creds),
            "fleet_budget": budget}
    now_us = int(time.time() * 1e6)
    start = threading.Barrier(hosts)
    results: dict[str, bool] = {}
    client = bucket_client(UploadConfig.model_validate({**base, "host": "any"}))

    def one_host(n: int) -> None:
        name, state = f"node-{n:03d}", tmp_path / f"node-{n:03d}"
        dump_id = f"{now_us + n}-0123456789abcdef-{1000 + n}"
        _fake_host_store(state, dump_id, f"core of {name} ".encode() * 1000)
        # One client for all (boto3 clients are thread-safe; making 200 would take most of the test's time).
        uploader = upload.Uploader(UploadConfig.model_validate({**base, "host": name}), state,
                                   client_factory=lambda: client)
        with Store(state) as store:
            start.wait()
            uploader.step(store)  # the whole path a daemon's uploader takes, one dump
            results[name] = store.db.execute("SELECT state FROM uploads").fetchone()[0] == "done"

    workers = [threading.Thread(target=one_host, args=(n,)) for n in range(hosts)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(300)
    assert len(results) == hosts and all(results.values())
    keys = s3.keys(bucket, "fleet/")
    assert len([k for k in keys if k.endswith(".zst")]) == budget
    assert len([k for k in keys if k.endswith(".json")]) == hosts
    slots = [k for k in keys if k.startswith("fleet/v1/budget/") and "/.probe/" not in k]
    assert len([k for k in slots if "/user/" not in k]) == budget  # the fleet's slots; beside them each user's
    assert len([k for k in keys if k.startswith("fleet/v2/index/")]) == hosts  # each host its own index file
