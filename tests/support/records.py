"""Real csplice spool records without crashing anything: the feeder plays the kernel and pipes a synthetic core
into csplice, which writes a schema-1 record exactly as on the crash path. Also the stored-dump figures the
daemon would report for them, made by really compressing the captured core."""

from __future__ import annotations

import os
import time
from pathlib import Path

import zstandard

from corehandler.observer import Stored
from support.csplice_harness import Handler, core_args


class RecordMaker:
    """csplice_harness.Handler's feeder -> csplice runs into a spool under `root`, and a store beside it for
    store_dump; `settings` go into csplice's settings file."""

    def __init__(self, feeder: Path, csplice: Path, root: Path, **settings: object) -> None:
        self.handler = Handler(root, settings=settings, csplice=csplice, feeder=feeder)
        self.spool = self.handler.spool
        self.store = root / "store"
        self.store.mkdir(mode=0o700, parents=True, exist_ok=True)

    def configure(self, **settings: object) -> None:
        self.handler.configure(**settings)

    def make(self, size: int, *, signal: int = 11, comm: str | bytes = "crasher") -> dict:
        """One crash of `size` bytes from this process (its /proc is read); the committed record."""
        pid = os.getpid()
        result = self.handler.feed(size, pid=pid, args=core_args(pid, comm=comm, signal=signal, hostname="testhost"))
        assert result.record is not None, f"csplice committed no record ({result.returncode}): {result.stderr}"
        return result.record

    def store_dump(self, record: dict) -> dict:
        return store_dump(record, self.spool, self.store)


def store_dump(record: dict, spool: Path, store: Path, level: int = 3) -> Stored:
    """What the daemon reports in on_ingested's `stored`: the core compressed with zstd into `store`."""
    started = time.monotonic()
    core = record.get("core")
    stored = {"id": record["id"], "path": None, "raw_bytes": 0, "stored_bytes": None,
              "compress_seconds": 0.0, "ingested_at": time.time(), "status": "dropped", "problem": None,
              "analysis": None}
    if core:
        source = spool / core
        target = store / f"{record['id']}.zst"
        t0 = time.monotonic()
        with open(source, "rb") as src, open(target, "wb") as dst:
            zstandard.ZstdCompressor(level=level).copy_stream(src, dst)
        stored.update(path=str(target), raw_bytes=source.stat().st_size,
                      stored_bytes=target.stat().st_size, compress_seconds=time.monotonic() - t0,
                      status="truncated" if record["capture"]["truncated"] else "ok")
    return Stored(**stored, ingest_seconds=time.monotonic() - started)
