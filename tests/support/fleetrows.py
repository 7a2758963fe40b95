"""Sidecars and index rows of a test fleet, put straight into a bucket (moto's or the real server's) as the
hosts' uploaders leave them: the sidecar, then the host's index part file of the crash's day."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from corehandler.fleet import bucket, dataset

NOW = 1_764_000_000.0  # 2025-11-24 UTC
DAY = bucket.crash_day(NOW)


def sidecar(host: str, n: int, signature: str = "crasher SIGSEGV main", *, core: bool = True,
            schema: int = 2) -> dict:
    dump_id = f"{int((NOW + n) * 1e6)}-0123456789abcdef-{n}"
    return {"schema": schema, "id": dump_id, "host": host, "crashed_at": NOW + n, "uploaded_at": NOW + n + 1,
            "signature": signature, "signature_source": "analysis", "budget": None,
            "core": {"key": f"k/{dump_id}.zst", "bytes": 100 + n, "encryption": None} if core else None,
            "index": {"exe": "/usr/bin/crasher", "comm": "crasher", "signal": 11, "uid": 1000, "status": "ok",
                      "raw_bytes": 1000 + n, "cmdline": ["crasher", "--secret"]},
            "analysis": {"state": "ok", "signature_id": "s1-0123", "exact_key": "x1-abcd",
                         "threads": [{"crashing": True, "frames": [{"function": "main"}]}]}}


def put_sidecar(client, target: bucket.Target, sc: dict, *, v1: bool = False, index: bool = True) -> str:
    day = bucket.crash_day(sc["crashed_at"])
    prefix = target.v1_day_prefix(sc["host"], day) if v1 else target.day_prefix(sc["host"], day)
    key = prefix + sc["id"] + ".json"
    client.put_object(Bucket=target.bucket, Key=key, Body=json.dumps(sc).encode())
    if index and not v1:
        host_target = bucket.Target(target.bucket, target.prefix, sc["host"])
        dataset.add(client, host_target, day, dataset.row(sc, key), local_state(client, host_target))
    return key


def local_state(client, target: bucket.Target) -> Path:
    """The host's local part state (dataset.local_dir), one per client: a test's bucket is new with its client."""
    if not hasattr(client, "_fleetrows_state"):
        client._fleetrows_state = tempfile.mkdtemp(prefix="fleetrows-")
    return dataset.local_dir(Path(client._fleetrows_state), target)


def put_old_part(client, target: bucket.Target, sidecars: list[dict]) -> list[str]:
    """Sidecars and one index part of their host's day as a host of index schema 1 wrote them (before
    signature_v1_id and no_core_reason; its sidecars without no_core): their keys."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys, rows = [], []
    for sc in sidecars:
        sc = {k: v for k, v in sc.items() if k != "no_core"}
        keys.append(put_sidecar(client, target, sc, index=False))
        row = {k: v for k, v in dataset.row(sc, keys[-1]).items() if k not in dataset.ADDED}
        rows.append(dict(row, index_schema=1))
    host, day = sidecars[0]["host"], bucket.crash_day(sidecars[0]["crashed_at"])
    body = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows, schema=dataset.schema(version=1)), body, compression="zstd")
    client.put_object(Bucket=target.bucket, Key=dataset.part_key(target, host, day, 0),
                      Body=body.getvalue().to_pybytes())
    return keys
