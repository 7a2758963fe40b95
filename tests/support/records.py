"""Real csplice spool records without crashing anything: the feeder plays the kernel and pipes a synthetic core
into csplice, which writes a schema-1 record exactly as on the crash path. Also the stored-dump figures the
daemon would report for them, made by really compressing the captured core."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import zstandard


class RecordMaker:
    """Runs feeder -> csplice into its own spool under `root`; `settings` go into csplice's settings file."""

    def __init__(self, feeder: Path, csplice: Path, root: Path, **settings: object) -> None:
        self.feeder, self.csplice, self.root = feeder, csplice, root
        self.spool = root / "spool"
        self.store = root / "store"
        self.spool.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.store.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.settings_file = root / "csplice.conf"
        self.configure(**settings)

    def configure(self, **settings: object) -> None:
        lines = [f"spool_dir={self.spool}", "min_free_percent=0"]
        lines += [f"{key}={value}" for key, value in settings.items()]
        self.settings_file.write_text("\n".join(lines) + "\n")

    def make(self, size: int, *, pid: int | None = None, signal: int = 11, comm: str | bytes = "crasher",
             hostname: str = "testhost", uid: int | None = None, gid: int | None = None) -> dict:
        """One crash of `size` bytes from process `pid` (its /proc is read, so it must be alive); the record."""
        pid = os.getpid() if pid is None else pid
        uid = os.getuid() if uid is None else uid
        gid = os.getgid() if gid is None else gid
        before = set(self.spool.glob("*.json"))
        argv = [str(self.csplice), str(pid), "1", str(pid), str(uid), str(gid), "1", str(signal),
                str(int(time.time())), "unlimited", hostname, comm]
        env = dict(os.environ, CSPLICE_SETTINGS=str(self.settings_file), CSPLICE_LOG_STDERR="1")
        subprocess.run([str(self.feeder), "--size", str(size), "--pid", str(pid), "--", *argv],
                       env=env, check=True, capture_output=True, timeout=60)
        (path,) = set(self.spool.glob("*.json")) - before
        return json.loads(path.read_text())

    def store_dump(self, record: dict) -> dict:
        return store_dump(record, self.spool, self.store)


def store_dump(record: dict, spool: Path, store: Path, level: int = 3) -> dict:
    """What the daemon reports in on_ingested's `stored`: the core compressed with zstd into `store`."""
    started = time.monotonic()
    core = record.get("core")
    stored = {"id": record["id"], "path": None, "raw_bytes": 0, "compressed_bytes": None,
              "compress_seconds": None, "ingest_seconds": None, "ingested_at": time.time(),
              "status": "metadata_only", "problem": None}
    if core:
        source = spool / core
        target = store / f"{record['id']}.zst"
        t0 = time.monotonic()
        with open(source, "rb") as src, open(target, "wb") as dst:
            zstandard.ZstdCompressor(level=level).copy_stream(src, dst)
        stored.update(path=str(target), raw_bytes=source.stat().st_size,
                      compressed_bytes=target.stat().st_size, compress_seconds=time.monotonic() - t0,
                      status="truncated" if record["capture"]["truncated"] else "ok")
    stored["ingest_seconds"] = time.monotonic() - started
    return stored
