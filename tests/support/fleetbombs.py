"""Hostile objects another host holding the fleet's credentials may write into the shared bucket: index parts
that decompress to far more than they weigh, of the wrong types or naming another host, and sidecars that
are not UTF-8, not JSON, nested past any parser or of an unknown schema."""

from __future__ import annotations

import io
import json

from corehandler.fleet import dataset
from support.fleetrows import sidecar


def _write(table, **options) -> bytes:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", **options)
    return buf.getvalue()


def rows(host: str = "mallory", n: int = 1) -> list[dict]:
    return [dataset.row(sidecar(host, 100 + i), f"forged/{i}.json") for i in range(n)]


def dictionary_bomb(value_bytes: int = 16 << 20, repeat: int = 4096) -> bytes:
    """A part whose `exe` is one value_bytes string repeated through the dictionary `repeat` times: a few KiB
    that a reader decoding it to Python objects turns into value_bytes * repeat (64 GiB by default). Its
    footer is honest (one dictionary page), so only what the reader does with the values bounds it."""
    import pyarrow as pa

    table = dataset.table([dict(r, id=f"bomb-{i}") for i, r in enumerate(rows(n=1) * repeat)])
    exe = pa.DictionaryArray.from_arrays(pa.array([0] * repeat, pa.int32()), pa.array(["A" * value_bytes]))
    table = table.set_column(table.schema.get_field_index("exe"),
                             pa.field("exe", pa.dictionary(pa.int32(), pa.string())), exe)
    return _write(table, store_schema=False)


def wide_bomb(value_bytes: int = 12 << 20, n: int = 3) -> bytes:
    """A part of n plain (not dictionary) strings of value_bytes: its footer says the column decodes to more
    than dataset.MAX_CHUNK_BYTES, so a reader refuses it before any page is read."""
    import pyarrow as pa

    table = dataset.table(rows(n=n))
    exe = pa.repeat(pa.scalar("A" * value_bytes), n)
    table = table.set_column(table.schema.get_field_index("exe"), pa.field("exe", pa.string()), exe)
    return _write(table, use_dictionary=False)


def string_times() -> bytes:
    """A part whose crashed_at is a string (DuckDB's BinderException on main)."""
    import pyarrow as pa

    table = dataset.table(rows())
    at = table.schema.get_field_index("crashed_at")
    return _write(table.set_column(at, pa.field("crashed_at", pa.string()), pa.array(["yesterday"])))


def claims_host(host: str) -> bytes:
    """A part with a `host` column of its own, as if its rows were another host's."""
    import pyarrow as pa

    table = dataset.table(rows())
    return _write(table.append_column(pa.field("host", pa.string()), pa.array([host])))


def forged_daily(host: str, n: int = 5) -> bytes:
    """A compacted day's file of forged rows of `host`."""
    return dataset.to_parquet([dict(r, host=host) for r in rows(host, n)], host=True)


def bad_sidecars(dump_id: str) -> dict[str, bytes]:
    """Sidecar bodies that must each be skipped, named, by every view (by what is wrong with them)."""
    good = sidecar("mallory", 7)
    return {
        "not UTF-8": json.dumps(dict(good, id=dump_id)).encode().replace(b"crasher", b"cr\xff\xfesher"),
        "not JSON": b"{\"schema\": 2, \"id\": \x1b[31m",
        "nested": b"[" * 100_000 + b"]" * 100_000,
        "unknown schema": json.dumps(dict(good, id=dump_id, schema=99)).encode(),
        "not an object": b"[1, 2, 3]",
    }
