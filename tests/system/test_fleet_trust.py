"""The bucket boundary, through the real S3 server: another host holding the fleet's credentials writes or
damages objects in the shared bucket, and nothing it writes stops this host's uploads, feeds what this host
uploads, rewrites other hosts' rows in the fleet view, or makes `fleet get` fetch what is not the dump's."""

from __future__ import annotations

import json

import pytest
import zstandard

from corehandler.fleet import bucket as layout
from corehandler.fleet import dataset, reader
from support import fleetbombs
from support.daemon_harness import Running, wait_for
from support.fleethost import Host
from support.fleetrows import DAY, put_sidecar, sidecar

pytestmark = pytest.mark.s3


def _counting_gets(uploader) -> list[str]:
    """The keys the uploader's own S3 client GETs from now on."""
    gets: list[str] = []
    make = uploader._client_factory

    def counted():
        client = make()
        client.meta.events.register("provide-client-params.s3.GetObject",
                                    lambda params, **_: gets.append(params["Key"]))
        return client
    uploader._client_factory = counted
    return gets


def test_a_planted_part_neither_stops_nor_feeds_this_hosts_uploads(tmp_path, s3, feeder, csplice):
    """Issue 34 HIGH 1: a bomb in this host's own index partition and a part named `part-zzzz.parquet` (int()
    raised on it for every upload of the day) are never read; this host's rows come from its state dir."""
    bucket = s3.new_bucket()
    alpha = Host(tmp_path, s3, bucket, "alpha")
    records = [alpha.crash(feeder, csplice, size=1 << 16, pid=pid) for pid in (1001, 1002)]
    day = layout.id_day(records[0]["id"])
    target = layout.Target(bucket, "fleet", "alpha")
    client = s3.client()
    bomb = fleetbombs.dictionary_bomb(4 << 20, 64)
    planted = [dataset.part_key(target, "alpha", day, 7), target.index_prefix("alpha", day) + "part-zzzz.parquet"]
    for key in planted:
        client.put_object(Bucket=bucket, Key=key, Body=bomb)
    uploader = alpha.uploader()
    gets = _counting_gets(uploader)
    with Running(alpha.settings, [uploader]):
        wait_for(lambda: alpha.done() == 2, what="both dumps uploaded past the planted parts", timeout=20)
    assert [k for k in gets if "/index/" in k] == []  # the bucket's parts were never read
    ours = dataset.part_key(target, "alpha", day, 8)  # after the highest part number listed, by name alone
    assert s3.keys(bucket, target.index_prefix("alpha", day)) == sorted(planted + [ours])
    import io

    import pyarrow.parquet as pq

    body = client.get_object(Bucket=bucket, Key=ours)["Body"].read()
    assert sorted(r["id"] for r in pq.read_table(io.BytesIO(body)).to_pylist()) == sorted(r["id"] for r in records)


def _list(host: Host, capsys, *args: str) -> tuple[int, list[dict] | None, str]:
    code, out, err = host.cli(capsys, "fleet", *args, "--date", str(DAY), "--json")
    return code, json.loads(out) if code == 0 else None, err


def test_one_host_cannot_rewrite_the_days_view_and_bad_objects_are_named(tmp_path, s3, capsys):
    """Issue 34 MEDIUM 5 and issue 38's bad objects: a compacted file that does not cover the day's parts is
    never read, a part of the wrong types or naming another host, damaged or past the size bounds is
    skipped and named, a sidecar's host is its key's, and a sidecar that is not UTF-8, not JSON or of an
    unknown schema is skipped and named, through the escaper, by list, --group and query alike; a damaged
    compacted file falls back to the day's parts, saying so."""
    bucket = s3.new_bucket()
    alpha = Host(tmp_path, s3, bucket, "alpha")
    client = s3.client()
    fleet = layout.Target(bucket, "fleet", "any")
    honest = sorted(put_sidecar(client, fleet, sidecar(h, n)) for h in ("alpha", "beta") for n in (1, 2))

    # Mallory's objects: a compacted file of forged alpha rows named to win, and parts under hosts of its own.
    client.put_object(Bucket=bucket, Key=dataset.daily_prefix(fleet, DAY) + "index-" + "f" * 32 + ".parquet",
                      Body=fleetbombs.forged_daily("alpha"))
    bad_parts = {"mallory": fleetbombs.string_times(), "mallory2": fleetbombs.claims_host("alpha"),
                 "mallory3": fleetbombs.wide_bomb(), "mallory4": b"PAR1 damaged"}
    for host, body in bad_parts.items():
        client.put_object(Bucket=bucket, Key=dataset.part_key(fleet, host, DAY, 0), Body=body)
    # Keys that a policy confining mallory to `*/host=mallory/*` lets it write, under alpha's partitions.
    nested = fleetbombs.rows("alpha", 3)
    client.put_object(Bucket=bucket, Key=fleet.index_prefix("alpha", DAY) + "x/host=mallory/part-00001.parquet",
                      Body=dataset.to_parquet(nested))
    forged = sidecar("alpha", 60)
    client.put_object(Bucket=bucket, Key=fleet.day_prefix("alpha", DAY) + f"x/host=mallory/{forged['id']}.json",
                      Body=json.dumps(forged).encode())
    # Eve's sidecars (no index file: read as uncovered): one claiming to be alpha's, and bad ones.
    eve = fleet.day_prefix("eve", DAY)
    claimer = sidecar("alpha", 50)
    client.put_object(Bucket=bucket, Key=eve + claimer["id"] + ".json", Body=json.dumps(claimer).encode())
    bad_sidecars = {}
    for n, (why, body) in enumerate(fleetbombs.bad_sidecars("x").items()):
        key = eve + f"\u202e{n}-{why.replace(' ', '-')}.json"
        client.put_object(Bucket=bucket, Key=key, Body=body)
        bad_sidecars[key] = why

    def check(code, rows, err, compacted=False):
        assert code == 0, err
        assert "Traceback" not in err and "BinderException" not in err
        for host in bad_parts if not compacted else ():
            assert f"s3://{bucket}/{dataset.part_key(fleet, host, DAY, 0)}" in err, (host, err)
        for key in bad_sidecars:
            assert "skipped s3://" + bucket + "/" + key.replace("\u202e", "\\u202e") in err
        assert "\u202e" not in err  # through the escaper
        return rows

    code, rows, err = _list(alpha, capsys, "list")
    check(code, rows, err)
    assert sorted(r["key"] for r in rows if r["host"] != "eve") == honest  # the forged compacted file unread,
    # and the keys nested under alpha's partitions too
    assert [r["host"] for r in rows if r["id"] == claimer["id"]] == ["eve"]  # the key's host, not the claim
    assert "decodes to" in err and "column crashed_at is string" in err and "unknown: host" in err
    code, groups, err = _list(alpha, capsys, "list", "--group")
    assert [(g["count"], sorted(g["hosts"])) for g in check(code, groups, err)] == [(5, ["alpha", "beta", "eve"])]
    code, counted, err = _list(alpha, capsys, "query", "SELECT host, count(*) AS n FROM dumps GROUP BY 1 ORDER BY 1")
    assert [(r["host"], r["n"]) for r in check(code, counted, err)] == [("alpha", 2), ("beta", 2), ("eve", 1)]

    # Compacted: the day's file under the digest of its parts stands for them (the bad ones left out, named).
    code, done, err = _list(alpha, capsys, "compact")
    assert code == 0 and [(d["rows"], d["skipped"]) for d in done] == [(4, 4)], err
    daily = done[0]["key"]
    code, rows, err = _list(alpha, capsys, "list")
    assert sorted(r["key"] for r in check(code, rows, err, compacted=True) if r["host"] != "eve") == honest
    # Damaged by hand: the day's parts instead, and the view says so.
    client.put_object(Bucket=bucket, Key=daily, Body=b"PAR1 not any more")
    code, rows, err = _list(alpha, capsys, "list", "--no-cache")
    assert sorted(r["key"] for r in check(code, rows, err) if r["host"] != "eve") == honest
    assert f"s3://{bucket}/{daily} is not a Parquet index file" in err and "reading the day's parts instead" in err


def _core(data: bytes) -> dict:
    import hashlib

    body = zstandard.ZstdCompressor().compress(data)
    return {"body": body, "bytes": len(body), "object_sha256": hashlib.sha256(body).hexdigest(),
            "raw_bytes": len(data), "raw_sha256": hashlib.sha256(data).hexdigest(), "compression": "zstd",
            "encryption": None}


def test_fleet_get_fetches_only_the_sidecars_own_core_and_stops_at_its_size(tmp_path, s3, capsys):
    """Issue 34 LOW: a forged sidecar's core.key may not name another dump's object, and a core that
    decompresses past the raw_bytes its sidecar gives stops there: an error, no file left."""
    bucket = s3.new_bucket()
    alpha = Host(tmp_path, s3, bucket, "alpha")
    client = s3.client()
    fleet = layout.Target(bucket, "fleet", "any")

    secret = sidecar("beta", 1)
    theirs = dict(_core(b"beta's secret memory" * 1000), key=fleet.day_prefix("beta", DAY) + secret["id"] + ".zst")
    client.put_object(Bucket=bucket, Key=theirs["key"], Body=theirs.pop("body"))
    forged = sidecar("alpha", 2)
    forged["core"] = theirs
    put_sidecar(client, fleet, forged)
    out = tmp_path / "out.core"
    code, _, err = alpha.cli(capsys, "fleet", "get", forged["id"], "-o", str(out))
    assert code != 0 and "not its own dump's" in err and not out.exists()

    # A core of its own key that decompresses to 64 MiB where the sidecar says 4 KiB.
    bomb = sidecar("alpha", 3)
    stream = zstandard.ZstdCompressor().compressobj()
    body = b"".join(stream.compress(b"A" * (1 << 20)) for _ in range(64)) + stream.flush()
    import hashlib

    bomb["core"] = {"key": fleet.day_prefix("alpha", DAY) + bomb["id"] + ".zst", "bytes": len(body),
                    "object_sha256": hashlib.sha256(body).hexdigest(), "raw_bytes": 4096, "compression": "zstd"}
    client.put_object(Bucket=bucket, Key=bomb["core"]["key"], Body=body)
    put_sidecar(client, fleet, bomb)
    seen = []
    with open(tmp_path / "direct", "wb") as f, pytest.raises(reader.FleetCorruptError, match="more than the 4096"):
        reader.fetch_core(client, fleet, reader.find(client, fleet, bomb["id"]), output=f, progress=seen.append,
                          workdir=tmp_path)
    assert sum(seen) <= len(body) + 4096 + (2 << 20)  # stopped within a chunk of raw_bytes, not at 64 MiB
    code, _, err = alpha.cli(capsys, "fleet", "get", bomb["id"], "-o", str(out))
    assert code != 0 and "more than the 4096" in err and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no partial file
    # An object bigger than its sidecar says is refused before its body is read.
    short = sidecar("alpha", 4)
    short["core"] = dict(bomb["core"], key=fleet.day_prefix("alpha", DAY) + short["id"] + ".zst", bytes=10)
    client.put_object(Bucket=bucket, Key=short["core"]["key"], Body=body)
    put_sidecar(client, fleet, short)
    code, _, err = alpha.cli(capsys, "fleet", "get", short["id"], "-o", str(out))
    assert code != 0 and "bytes, more than the 10 it may have" in err and not out.exists()


def test_one_user_cannot_spend_a_signatures_fleet_budget(tmp_path, s3):
    """Issue 34 LOW: per uid before global. A user crashing a process that mimics a signature takes at most
    their share of its fleet budget (half of it by default); another user still gets a core; root's crashes
    have a pool of their own that no user's crash takes."""
    import time

    from corehandler.config import UploadConfig
    from corehandler.fleet import upload
    from corehandler.store.index import Store
    from support.fleethost import store_with_dump

    bucket = s3.new_bucket()
    creds = s3.credentials_file(tmp_path / "credentials")
    client = s3.client()
    now_us = int(time.time() * 1e6)

    def crash(host: str, uid: int, n: int) -> str:
        state = tmp_path / f"{host}-{n}"
        dump_id = f"{now_us + n}-0123456789abcdef-{n}"
        store_with_dump(state, dump_id, b"the same crash " * 100, uid=uid)
        config = UploadConfig.model_validate({"url": f"s3://{bucket}/fleet", "endpoint": s3.endpoint, "host": host,
                                              "credentials_file": str(creds), "fleet_budget": 2})
        with Store(state) as store:
            upload.Uploader(config, state, client_factory=lambda: client).step(store)
            return store.db.execute("SELECT budget FROM uploads").fetchone()[0]

    assert [crash("alpha", 1000, n) for n in range(3)] == ["slot 0", "kept_back", "kept_back"]  # the mimic
    assert crash("alpha", 1001, 3) == "slot 1"   # another user of that host: the fleet's second slot
    assert crash("beta", 1002, 4) == "kept_back"  # the fleet's budget is still one budget
    assert crash("beta", 0, 5) == "slot 0"        # root's own pool
    assert crash("alpha", 0, 6) == "slot 1"
