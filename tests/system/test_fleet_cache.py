"""The fleet view's local cache through the real S3 server (corehandler/fleet/fleetview.py): a day not
compacted is read warm from one file merged locally from its hosts' part files, fetched only where a part
changed, and whatever changed in the bucket, a warm view answers what a cold one does."""

from __future__ import annotations

import pytest

from corehandler.fleet import bucket, dataset, fleetview, reader
from support.fleetrows import DAY, put_sidecar, sidecar

pytestmark = pytest.mark.s3


@pytest.fixture
def fleet(s3):
    """A bucket with three hosts' dumps of DAY, not compacted; its client and the keys it GETs (botocore's
    own event, so what goes over the wire)."""
    client, gets = s3.client(), []
    client.meta.events.register("provide-client-params.s3.GetObject",
                                lambda params, **_: gets.append(params["Key"]))
    target = bucket.Target(s3.new_bucket(), "p", "any")
    for n, host in enumerate(("alpha", "beta", "gamma")):
        for i in range(2):
            put_sidecar(client, target, sidecar(host, 10 * n + i, signature=f"sig {i}"))
    gets.clear()
    return client, target, gets


def answer(client, target, cache, hosts=()):
    """What `fleet list` shows (every row, the skipped objects) and the files DuckDB read for it."""
    view = fleetview.collect(client, target, [DAY], hosts, cache=cache)
    try:
        _, values = fleetview.rows(view.connect(), fleetview.LIST_SQL)
        return values, sorted(view.skipped), list(view.files)
    finally:
        view.close()


def part(target, host: str) -> str:
    return dataset.part_key(target, host, DAY, 0)


def test_a_day_of_part_files_is_read_warm_from_its_merged_file_while_no_part_changed(fleet, tmp_path, monkeypatch):
    client, target, gets = fleet
    cache = reader.SidecarCache(tmp_path / "fleet.sqlite")
    rows, skipped, files = answer(client, target, cache)
    assert len(rows) == 6 and skipped == [] and sorted(gets) == sorted(part(target, h) for h in
                                                                       ("alpha", "beta", "gamma"))
    (merged,) = files  # one file for the day, not one per host
    assert merged.parents[1].name == fleetview.MERGED
    inode = merged.stat().st_ino

    gets.clear()
    assert answer(client, target, cache) == (rows, [], [merged])
    assert gets == [] and merged.stat().st_ino == inode  # nothing fetched, nothing merged again

    # Only some hosts: the merge of theirs, the whole day's file untouched.
    beta, _, (only_beta,) = answer(client, target, cache, hosts=("beta",))
    assert len(beta) == 2 and {r[1] for r in beta} == {"beta"} and only_beta != merged and gets == []
    assert answer(client, target, cache)[2] == [merged] and merged.stat().st_ino == inode

    # A part changed: its file alone is fetched; the day merged anew; the old merged file dropped once no run
    # can still be reading it.
    monkeypatch.setattr(fleetview, "MERGED_GRACE", 0)
    put_sidecar(client, target, sidecar("alpha", 7))
    gets.clear()
    rows, _, (again,) = answer(client, target, cache)
    assert len(rows) == 7 and gets == [part(target, "alpha")] and again != merged and not merged.exists()
    assert sorted(again.parent.iterdir()) == [again]
    cache.close()


def rewrite(client, target, monkeypatch):
    put_sidecar(client, target, sidecar("alpha", 7))
    return [part(target, "alpha")]


def new_host(client, target, monkeypatch):
    put_sidecar(client, target, sidecar("delta", 40))
    return [part(target, "delta")]


def deleted(client, target, monkeypatch):
    # All of a host's objects of the day expired (a lifecycle rule), its part file with them.
    for key, _ in reader.list_keys(client, target, target.day_prefix("beta", DAY), ""):
        client.delete_object(Bucket=target.bucket, Key=key)
    client.delete_object(Bucket=target.bucket, Key=part(target, "beta"))
    return []


NEWER = dataset.INDEX_SCHEMA + 1


def sidecars_of(client, target, host: str) -> list[str]:
    return [k for k, _ in reader.list_keys(client, target, target.day_prefix(host, DAY), direct=True)]


def newer_schema(client, target, monkeypatch):
    """A host of a newer corehandler: its part is left out, its sidecars read instead."""
    monkeypatch.setattr(dataset, "INDEX_SCHEMA", NEWER)
    client.put_object(Bucket=target.bucket, Key=part(target, "beta"),
                      Body=dataset.to_parquet([dataset.row(sidecar("beta", 10), "k")]))
    monkeypatch.undo()
    return [part(target, "beta")] + sidecars_of(client, target, "beta")


def damaged(client, target, monkeypatch):
    client.put_object(Bucket=target.bucket, Key=part(target, "gamma"), Body=b"PAR1 not really")
    return [part(target, "gamma")] + sidecars_of(client, target, "gamma")


def compacted(client, target, monkeypatch):
    dataset.compact(client, target, DAY)
    return [dataset.daily_key(target, DAY, reader.list_keys(client, target, target.index_day_prefix(DAY),
                                                            ".parquet"))]


@pytest.mark.parametrize("change, count", [(rewrite, 7), (new_host, 7), (deleted, 4), (newer_schema, 6),
                                           (damaged, 6), (compacted, 6)])
def test_after_a_change_in_the_bucket_a_warm_view_answers_as_a_cold_one(fleet, tmp_path, monkeypatch, change,
                                                                        count):
    client, target, gets = fleet
    cache = reader.SidecarCache(tmp_path / "fleet.sqlite")
    _, _, before = answer(client, target, cache)
    fetched = change(client, target, monkeypatch)

    gets.clear()
    warm = answer(client, target, cache)
    assert sorted(gets) == sorted(fetched)  # the changed file alone (and the sidecars read in its place)
    cold = answer(client, target, None)
    assert warm[:2] == cold[:2] and len(warm[0]) == count
    (file,) = warm[2]
    assert file != before[0]  # a new merged file (or the compacted one), never the stale merge
    if change in (newer_schema, damaged):
        (why,) = warm[1]
        assert fetched[0] in why and (f"index schema {NEWER}" in why if change is newer_schema else
                                      "not a Parquet index file" in why)
        assert why.endswith("'s sidecars of the day instead")

    # Once more with nothing changed: nothing fetched, the same answer (a skipped file named from the cache).
    gets.clear()
    assert answer(client, target, cache) == warm and gets == []
    cache.close()


def test_a_file_skipped_as_newer_is_read_once_this_corehandler_knows_its_schema(fleet, tmp_path, monkeypatch):
    client, target, gets = fleet
    cache = reader.SidecarCache(tmp_path / "fleet.sqlite")
    answer(client, target, cache)
    newer_schema(client, target, monkeypatch)
    rows, skipped, _ = answer(client, target, cache)
    assert len(rows) == 6 and len(skipped) == 1  # beta's two from its sidecars
    monkeypatch.setattr(dataset, "INDEX_SCHEMA", NEWER)  # the upgrade: its cache's checks were another schema's
    gets.clear()
    rows, skipped, _ = answer(client, target, cache)
    assert len(rows) == 5 and skipped == [] and gets == []  # beta's one row of the newer schema with the others
    cache.close()
