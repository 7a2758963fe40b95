"""The fleet view through the real S3 server: `fleet list`, `fleet query SQL` over the hosts' Parquet index
files and the sidecars no index covers, v1 objects (corehandler 0.2) still read, unreadable sidecars named."""

from __future__ import annotations

import json
import threading

import pytest

from corehandler.errors import EXIT_USAGE
from corehandler.fleet import bucket as layout
from corehandler.fleet import dataset
from support.daemon_harness import Running, wait_for
from support.fleethost import Host, sha_file

pytestmark = pytest.mark.s3


def test_fleet_query_runs_sql_over_the_index_v1_objects_and_uncovered_sidecars(tmp_path, s3, feeder, csplice,
                                                                               capsys):
    bucket = s3.new_bucket()
    alpha, beta = Host(tmp_path, s3, bucket, "alpha"), Host(tmp_path, s3, bucket, "beta")
    records = [alpha.crash(feeder, csplice, size=1 << 20, pid=1001), beta.crash(feeder, csplice, size=1 << 20,
                                                                                pid=1002)]
    with Running(alpha.settings, [alpha.uploader()]), Running(beta.settings, [beta.uploader()]):
        wait_for(lambda: alpha.done() == 1 and beta.done() == 1, what="both hosts' uploads")
    client = s3.client()
    assert len(s3.keys(bucket, "fleet/v2/index/")) == 2  # one file per host and day

    # A corehandler 0.2 host's dump, in the v1 layout, and a sidecar of the v2 layout that is not JSON.
    target = layout.Target(bucket, "fleet", "legacy")
    day = layout.id_day(records[0]["id"])
    v2_key = next(k for k in s3.keys(bucket, "fleet/v2/dt=") if k.endswith(records[0]["id"] + ".json"))
    old = json.loads(client.get_object(Bucket=bucket, Key=v2_key)["Body"].read())
    v1_core = target.v1_day_prefix("legacy", day) + records[0]["id"] + ".zst"
    client.copy_object(Bucket=bucket, Key=v1_core, CopySource={"Bucket": bucket, "Key": old["core"]["key"]})
    old.update(schema=1, host="legacy", core={k: v for k, v in dict(old["core"], key=v1_core).items()
                                              if k not in ("checksum", "part_size")})  # as 0.2 wrote it
    client.put_object(Bucket=bucket, Key=target.v1_day_prefix("legacy", day) + records[0]["id"] + ".json",
                      Body=json.dumps(old).encode())
    broken = target.day_prefix("broken", day) + "1-0123456789abcdef-1.json"
    client.put_object(Bucket=bucket, Key=broken, Body=b"{not json")

    code, out, err = alpha.cli(capsys, "fleet", "list", "--days", "2", "--json")
    assert code == 0, err
    assert sorted(r["host"] for r in json.loads(out)) == ["alpha", "beta", "legacy"]
    assert f"skipped s3://{bucket}/{broken} is not a JSON sidecar" in err

    sql = "SELECT host, count(*) AS n, sum(raw_bytes) AS raw FROM dumps GROUP BY host ORDER BY host"
    code, out, err = alpha.cli(capsys, "fleet", "query", "--days", "2", "--json", sql)
    assert code == 0, err
    assert [(r["host"], r["n"], r["raw"]) for r in json.loads(out)] == \
        [("alpha", 1, 1 << 20), ("beta", 1, 1 << 20), ("legacy", 1, 1 << 20)]
    code, out, _ = alpha.cli(capsys, "fleet", "query", "--days", "2", "SELECT count(*) AS n FROM dumps")
    assert code == 0 and out.split() == ["n", "3"]

    code, out, err = alpha.cli(capsys, "fleet", "query", "--days", "2", "SELECT nope FROM dumps")
    assert code == EXIT_USAGE and "fleet query:" in err and "Traceback" not in err

    # Compaction, four at once (as cron jobs of several hosts may): one file of the day, and the same answers.
    results = []
    threads = [threading.Thread(target=lambda: results.append(dataset.compact(
        client, layout.Target(bucket, "fleet", "any"), day))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 4 and len({r[:2] for r in results}) == 1
    daily = s3.keys(bucket, "fleet/v2/daily/")
    assert len(daily) == 1 and daily[0].startswith(f"fleet/v2/daily/dt={day}/index-")
    code, out, err = alpha.cli(capsys, "fleet", "compact", "--days", "2", "--json")
    assert code == 0 and [d["rows"] for d in json.loads(out) if d["key"]] == [2] and s3.keys(
        bucket, "fleet/v2/daily/") == daily
    code, out, err = alpha.cli(capsys, "fleet", "query", "--days", "2", "--json", sql)
    assert [(r["host"], r["n"]) for r in json.loads(out)] == [("alpha", 1), ("beta", 1), ("legacy", 1)]

    out_file = tmp_path / "legacy.core"
    code, _, err = alpha.cli(capsys, "fleet", "get", records[0]["id"], "--host", "legacy", "-o", str(out_file))
    assert code == 0, err
    assert sha_file(out_file) == records[0]["_sha256"]
