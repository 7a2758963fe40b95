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
