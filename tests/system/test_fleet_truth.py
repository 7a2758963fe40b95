"""What the fleet views say off the happy path, through the real S3 server (issue 38): a core deleted from the
bucket by hand, a dump whose core stayed home (and why), an index file that cannot be read, and an upgrade to
signature v2 that must not make every group new."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest

from corehandler.errors import EXIT_NOMATCH
from corehandler.fleet import bucket as layout
from corehandler.fleet import dataset
from support.daemon_harness import Running, wait_for
from support.fleethost import Host, sha_file
from support.fleetrows import DAY, put_old_part, put_sidecar, sidecar
from support.spoolfeed import write_settings

pytestmark = pytest.mark.s3


def _json(host: Host, capsys, *args: str):
    code, out, err = host.cli(capsys, "fleet", *args, "--json")
    assert code == 0, err
    return json.loads(out), err


def _part_rows(client, bucket: str, key: str) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(client.get_object(Bucket=bucket, Key=key)["Body"].read())).to_pylist()


def test_a_core_deleted_by_hand_is_missing_in_list_info_and_get(tmp_path, s3, feeder, csplice, capsys):
    bucket = s3.new_bucket()
    alpha = Host(tmp_path, s3, bucket, "alpha")
    kept, gone = (alpha.crash(feeder, csplice, size=1 << 16, pid=pid) for pid in (2001, 2002))
    alpha.upload_all(2)
    day = str(layout.id_day(gone["id"]))
    rows, _ = _json(alpha, capsys, "list", "--date", day)
    by_id = {r["id"]: r for r in rows}
    core_key = by_id[gone["id"]]["core_key"]
    client = s3.client()
    client.delete_object(Bucket=bucket, Key=core_key)

    rows, _ = _json(alpha, capsys, "list", "--date", day)
    assert [(r["id"], r["core"], r["core_missing"]) for r in rows] == [(kept["id"], True, False),
                                                                      (gone["id"], True, True)]
    code, out, _ = alpha.cli(capsys, "fleet", "list", "--date", day)
    [line] = [line for line in out.splitlines() if gone["id"] in line]
    assert code == 0 and "MISSING" in line

    out_file = tmp_path / "gone.core"
    code, _, err = alpha.cli(capsys, "fleet", "get", gone["id"], "-o", str(out_file))
    assert code == EXIT_NOMATCH and not out_file.exists()
    assert f"core missing from the bucket: s3://{bucket}/{core_key} is gone" in err
    assert "upload.url" not in err and "create the bucket" not in err  # not the bucket's fault
    code, _, err = alpha.cli(capsys, "fleet", "get", kept["id"], "-o", str(out_file))
    assert code == 0 and sha_file(out_file) == kept["_sha256"], err

    code, out, _ = alpha.cli(capsys, "fleet", "info", gone["id"])
    assert code == 0 and "MISSING from the bucket" in out
    info, _ = _json(alpha, capsys, "info", gone["id"])
    assert info["core_missing"] is True and info["core"]["key"] == core_key

    mini = info["mini"]["key"]
    client.delete_object(Bucket=bucket, Key=mini)
    code, _, err = alpha.cli(capsys, "fleet", "get", gone["id"], "--mini", "-o", str(tmp_path / "mini"))
    assert code == EXIT_NOMATCH and f"mini core missing from the bucket: s3://{bucket}/{mini}" in err


def test_every_dump_without_its_core_says_why_everywhere(tmp_path, s3, feeder, csplice, capsys):
    """send = "metadata", the fleet budget of a signature's day, and a crash storm csplice dropped: the reason
    in the sidecar (no_core), the host's Parquet index (no_core_reason, no_core_why), `fleet list` (its table
    and --json), `info`, and `fleet get`'s error, never "budget: None"."""
    bucket = s3.new_bucket()
    meta = Host(tmp_path, s3, bucket, "meta", send="metadata")
    budget = Host(tmp_path, s3, bucket, "budget", fleet_budget=1)
    storm = Host(tmp_path, s3, bucket, "storm")
    write_settings(storm.csplice_settings, storm.state / "spool", max_per_exe_per_minute=1)
    meta.crash(feeder, csplice, size=1 << 16, pid=3001)
    budget_ids = [budget.crash(feeder, csplice, size=1 << 16, pid=pid)["id"] for pid in (3002, 3003)]
    storm_records = [storm.crash(feeder, csplice, size=1 << 16, pid=pid, keep_core=False) for pid in (3004, 3005)]
    assert storm_records[1]["capture"]["dropped_reason"] == "max_per_exe_per_minute"
    with Running(meta.settings, [meta.uploader()]), Running(budget.settings, [budget.uploader()]), \
            Running(storm.settings, [storm.uploader()]):
        wait_for(lambda: (meta.done(), budget.done(), storm.done()) == (1, 2, 2), what="every upload", timeout=90)
    day = str(layout.id_day(budget_ids[0]))

    rows, err = _json(meta, capsys, "list", "--date", day)
    assert "skipped" not in err
    without = {r["host"]: r for r in rows if not r["core"]}
    assert sorted(without) == ["budget", "meta", "storm"]
    assert without["meta"]["no_core_reason"] == "send_metadata"
    assert 'send = "metadata"' in without["meta"]["no_core_why"]
    kept_back = without["budget"]
    assert kept_back["id"] == budget_ids[1] and kept_back["budget"] == "kept_back"
    assert kept_back["no_core_reason"] == "fleet_budget"
    assert f"the fleet budget of signature {kept_back['signature']!r} on {day} was spent" in kept_back["no_core_why"]
    dropped = without["storm"]
    assert dropped["id"] == storm_records[1]["id"] and dropped["no_core_reason"] == "capture:max_per_exe_per_minute"
    assert dropped["no_core_why"].startswith("crash storm: ")
    assert all(r["no_core_reason"] is None for r in rows if r["core"])

    code, out, _ = meta.cli(capsys, "fleet", "list", "--date", day)
    cells = {line.split()[2]: line for line in out.splitlines()[1:]}
    assert "send=metadata" in cells["meta"] and "fleet budget" in cells["budget"] and \
        "dropped: max_per_exe_per_minute" in cells["storm"]

    client = s3.client()
    for r in without.values():
        sc = json.loads(client.get_object(Bucket=bucket, Key=r["key"])["Body"].read())
        assert sc["core"] is None and sc["no_core"] == {"reason": r["no_core_reason"], "why": r["no_core_why"]}
        target = layout.Target(bucket, "fleet", r["host"])
        [part] = s3.keys(bucket, target.index_prefix(r["host"], layout.id_day(r["id"])))
        [indexed] = [x for x in _part_rows(client, bucket, part) if x["id"] == r["id"]]
        assert (indexed["index_schema"], indexed["no_core_reason"], indexed["no_core_why"]) == \
            (dataset.INDEX_SCHEMA, r["no_core_reason"], r["no_core_why"])

        code, out, _ = meta.cli(capsys, "fleet", "info", r["id"])
        assert code == 0 and f"Core:      none: {r['no_core_why']}" in out
        code, _, err = meta.cli(capsys, "fleet", "get", r["id"], "-o", str(tmp_path / "core"))
        assert code == EXIT_NOMATCH and f"has no core in the bucket: {r['no_core_why']}" in err
        assert "budget: None" not in err and not (tmp_path / "core").exists()


def test_old_sidecars_and_index_files_say_what_they_can(tmp_path, s3, capsys):
    """Objects of before no_core (index schema 1, sidecars without it) read fine, and their budget, status
    and record say why a core is not there."""
    bucket = s3.new_bucket()
    alpha = Host(tmp_path, s3, bucket, "alpha")
    client, fleet = s3.client(), layout.Target(bucket, "fleet", "any")
    kept_back = dict(sidecar("old", 1, core=False), budget="kept_back")
    dropped = sidecar("old", 2, core=False)
    dropped["index"]["status"] = "dropped"
    unknown = sidecar("old", 3, core=False)
    put_old_part(client, fleet, [kept_back, dropped, unknown, sidecar("old", 4)])
    stormed = sidecar("unindexed", 5, core=False)  # no index file: read from its sidecar, record and all
    stormed["index"]["status"] = "dropped"
    stormed["record"] = {"capture": {"dropped": True, "dropped_reason": "max_pending"}}
    put_sidecar(client, fleet, stormed, index=False)

    rows, err = _json(alpha, capsys, "list", "--date", str(DAY))
    assert "skipped" not in err
    said = {r["id"]: (r["no_core_reason"], r["no_core_why"]) for r in rows}
    assert said[kept_back["id"]][0] == "fleet_budget" and "fleet budget" in said[kept_back["id"]][1]
    assert said[dropped["id"]][0] == "capture" and "dropped at capture" in said[dropped["id"]][1]
    assert said[unknown["id"]][0] == "unknown" and "did not record why" in said[unknown["id"]][1]
    assert said[sidecar("old", 4)["id"]] == (None, None)
    assert said[stormed["id"]][0] == "capture:max_pending" and "max_pending" in said[stormed["id"]][1]
    code, _, err = alpha.cli(capsys, "fleet", "get", kept_back["id"], "-o", str(tmp_path / "c"))
    assert code == EXIT_NOMATCH and "the fleet budget of its signature on its crash day was spent" in err


def test_an_unreadable_index_file_reads_its_hosts_day_from_the_sidecars(tmp_path, s3, capsys):
    """A host's part damaged by hand: its day comes from its sidecars, and list, --group and query say so;
    compacted then, the day's file names the host it left out, and readers still read its sidecars."""
    bucket = s3.new_bucket()
    alpha = Host(tmp_path, s3, bucket, "alpha")
    client, fleet = s3.client(), layout.Target(bucket, "fleet", "any")
    keys = [put_sidecar(client, fleet, sidecar(h, n)) for h in ("alpha", "beta") for n in (1, 2, 3)]
    damaged = dataset.part_key(fleet, "beta", DAY, 0)
    client.put_object(Bucket=bucket, Key=damaged, Body=b"PAR1 damaged by hand PAR1")
    instead = "reading beta's sidecars of the day instead"

    rows, err = _json(alpha, capsys, "list", "--date", str(DAY))
    assert sorted(r["key"] for r in rows) == sorted(keys)
    assert f"skipped s3://{bucket}/{damaged} is not a Parquet index file" in err and instead in err
    groups, err = _json(alpha, capsys, "list", "--group", "--date", str(DAY), "--no-cache")
    assert [(g["count"], g["hosts"]) for g in groups] == [(6, ["alpha", "beta"])] and instead in err
    counted, err = _json(alpha, capsys, "query", "SELECT host, count(*) AS n FROM dumps GROUP BY 1 ORDER BY 1",
                         "--date", str(DAY))
    assert [(r["host"], r["n"]) for r in counted] == [("alpha", 3), ("beta", 3)] and instead in err

    done, err = _json(alpha, capsys, "compact", "--date", str(DAY))
    assert [(d["rows"], d["skipped"]) for d in done] == [(3, 1)] and damaged in err
    rows, err = _json(alpha, capsys, "list", "--date", str(DAY))
    assert sorted(r["key"] for r in rows) == sorted(keys)
    assert f"s3://{bucket}/{done[0]['key']} left out beta's index file of the day" in err and instead in err
    rows, err = _json(alpha, capsys, "list", "--date", str(DAY), "--host", "alpha")
    assert sorted(r["host"] for r in rows) == ["alpha"] * 3 and "beta" not in err


def test_a_part_whose_pages_are_damaged_behind_a_sound_footer_is_left_out_by_name(tmp_path, s3, capsys):
    """A host's part file whose footer reads but whose pages do not: the day's merge meets it (parts are not
    scanned one by one), names it, and reads that host's day from its sidecars; the next, warm, view says so
    again from what the cache kept."""
    import pyarrow.parquet as pq

    bucket = s3.new_bucket()
    alpha = Host(tmp_path, s3, bucket, "alpha")
    client, fleet = s3.client(), layout.Target(bucket, "fleet", "any")
    keys = [put_sidecar(client, fleet, sidecar(h, n)) for h in ("alpha", "beta") for n in (1, 2, 3)]
    damaged = dataset.part_key(fleet, "beta", DAY, 0)
    data = bytearray(client.get_object(Bucket=bucket, Key=damaged)["Body"].read())
    meta = pq.ParquetFile(io.BytesIO(bytes(data))).metadata
    for g in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            chunk = meta.row_group(g).column(c)
            start = min(o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o)
            data[start:start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    client.put_object(Bucket=bucket, Key=damaged, Body=bytes(data))
    assert pq.ParquetFile(io.BytesIO(bytes(data))).metadata.num_rows == 3  # the footer still reads
    instead = f"s3://{bucket}/{damaged} is not a Parquet index file"

    for _ in ("cold", "warm"):
        rows, err = _json(alpha, capsys, "list", "--date", str(DAY))
        assert sorted(r["key"] for r in rows) == sorted(keys)
        assert instead in err and "reading beta's sidecars of the day instead" in err
    groups, err = _json(alpha, capsys, "list", "--group", "--date", str(DAY), "--no-cache")
    assert [(g["count"], g["hosts"]) for g in groups] == [(6, ["alpha", "beta"])] and instead in err


def _v(host: str, n: int, day: dt.date, signature: str, sid: str, v1: str | None) -> dict:
    """A sidecar of `day` with that signature, its id and (an upgraded host's) v1 id."""
    sc = sidecar(host, n, signature)
    at = dt.datetime.combine(day, dt.time(12), dt.timezone.utc).timestamp() + n
    dump_id = f"{int(at * 1e6)}-0123456789abcdef-{n}"
    sc.update(id=dump_id, crashed_at=at, uploaded_at=at + 1)
    sc["core"]["key"] = f"k/{dump_id}.zst"
    sc["analysis"]["signature_id"] = sid
    if v1:
        sc["analysis"]["signature_v1_id"] = v1
    return sc


def test_an_upgrade_to_signature_v2_makes_no_group_new(tmp_path, s3, capsys):
    """Hosts of before signature v2 wrote index files of schema 1 (v1 signatures); upgraded hosts write v2
    signatures with their v1 id. A v2 group whose v1 id was seen before --new-since counts those dumps and
    is not new; one whose v1 id was never seen is; a host still on v1 after the others upgraded joins the
    v2 group too."""
    bucket = s3.new_bucket()
    alpha = Host(tmp_path, s3, bucket, "alpha")
    client, fleet = s3.client(), layout.Target(bucket, "fleet", "any")
    last = DAY
    d = [last - dt.timedelta(days=n) for n in (3, 2, 1, 0)]
    v1_parse, v1_gone = "app SIGSEGV app+0x1234 < main", "app SIGABRT abort < app+0x99"
    put_old_part(client, fleet, [_v("old", 1, d[0], v1_parse, "s1-aaaa", None),
                                 _v("old", 2, d[0], v1_gone, "s1-bbbb", None)])
    put_old_part(client, fleet, [_v("old", 3, d[1], v1_parse, "s1-aaaa", None)])
    for n, day in ((4, d[2]), (5, d[3])):
        put_sidecar(client, fleet, _v("new", n, day, "app SIGSEGV parse", "s2-parse", "s1-aaaa"))
    put_sidecar(client, fleet, _v("new", 6, d[3], "app SIGSEGV fresh", "s2-fresh", "s1-cccc"))
    put_old_part(client, fleet, [_v("laggard", 7, d[3], v1_parse, "s1-aaaa", None)])  # not upgraded yet

    window = ["--date", str(last), "--days", "4"]
    data, err = _json(alpha, capsys, "report", *window, "--new-since", str(d[2]))
    assert "skipped" not in err
    sigs = {s["signature"]: s for s in data["signatures"]}
    assert sorted(sigs) == sorted(["app SIGSEGV fresh", "app SIGSEGV parse", v1_gone])
    parse = sigs["app SIGSEGV parse"]
    assert (parse["count"], parse["per_day"], parse["new"], parse["signature_v1_ids"], parse["linked_v1"]) == \
        (5, [1, 1, 1, 2], False, ["s1-aaaa"], 3)
    assert parse["first_seen"] < dt.datetime.combine(d[1], dt.time(), dt.timezone.utc).timestamp()
    assert sigs["app SIGSEGV fresh"]["new"] is True and sigs[v1_gone]["new"] is False
    assert data["totals"]["signatures"] == 3
    page = tmp_path / "report.html"
    code, _, err = alpha.cli(capsys, "fleet", "report", *window, "--new-since", str(d[2]), "-o", str(page))
    row = next(r for r in page.read_text().split("<tr>") if "app SIGSEGV parse" in r)
    assert code == 0 and "v1: s1-aaaa (3 of its dumps)" in row and 'class="new"' not in row, err

    groups, _ = _json(alpha, capsys, "list", "--group", *window)
    assert [(g["signature"], g["count"], g["signature_v1_ids"]) for g in groups] == \
        [("app SIGSEGV parse", 5, ["s1-aaaa"]), (v1_gone, 1, ["s1-bbbb"]), ("app SIGSEGV fresh", 1, ["s1-cccc"])]
    assert groups[0]["first_seen"] == min(r["first_seen"] for r in groups)
    # The index as written: schema 1's rows have no signature_v1_id; the view gives them their own v1 id.
    old = _part_rows(client, bucket, dataset.part_key(fleet, "old", d[0], 0))
    assert "signature_v1_id" not in old[0] and old[0]["index_schema"] == 1
    rows, _ = _json(alpha, capsys, "query", "SELECT host, signature_v1_id, index_schema FROM dumps ORDER BY crashed_at",
                    *window)
    assert [(r["host"], r["signature_v1_id"]) for r in rows] == \
        [("old", "s1-aaaa"), ("old", "s1-bbbb"), ("old", "s1-aaaa"), ("new", "s1-aaaa"), ("new", "s1-aaaa"),
         ("new", "s1-cccc"), ("laggard", "s1-aaaa")]
    assert {r["index_schema"] for r in rows} == {1, dataset.INDEX_SCHEMA}

    # Compacted, old and new files together: the same groups.
    for day in d:
        dataset.compact(client, fleet, day)
    again, _ = _json(alpha, capsys, "list", "--group", *window)
    assert [(g["signature"], g["count"]) for g in again] == [(g["signature"], g["count"]) for g in groups]
