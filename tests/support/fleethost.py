"""One machine of a test fleet: a state dir, spool and csplice settings, an [upload] section for the real S3
server (tests/support/s3server.py), its daemon and uploader, and the CLI run as that host."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from corehandler.cli import main
from corehandler.config import UploadConfig, toml_value
from corehandler.daemon import Settings
from corehandler.fleet import upload
from corehandler.store import upload_queue
from corehandler.store.dumprow import row_from_record
from corehandler.store.index import Store
from support.daemon_harness import Running, wait_for
from support.spoolfeed import feed, write_settings


def upload_config(s3, bucket: str, tmp_path: Path, host: str = "alpha", **over) -> dict:
    creds = tmp_path / f"credentials-{host}"
    if not creds.exists():
        s3.credentials_file(creds)
    return {"url": f"s3://{bucket}/fleet", "endpoint": s3.endpoint, "credentials_file": str(creds), "host": host,
            "retry_initial": "100ms", "retry_max": "1s", **over}


class Host:
    """One machine of the fleet: its state dir, spool, csplice settings and [upload] section."""

    def __init__(self, tmp_path: Path, s3, bucket: str, name: str = "alpha", compression: bool = True, **upload):
        self.root = tmp_path / name
        self.state = self.root / "state"
        (self.state / "spool").mkdir(parents=True, mode=0o700)
        self.csplice_settings = write_settings(self.root / "csplice.conf", self.state / "spool")
        self.upload = upload_config(s3, bucket, self.root, name, **upload)
        self.config_dir = self.root / "etc"
        (self.config_dir / "corehandler.d").mkdir(parents=True)
        (self.config_dir / "corehandler.d" / "50-upload.toml").write_text(
            "[upload]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in self.upload.items()))
        self.settings = Settings(self.state, compression=compression, threads=1, sweep_interval=3600)
        self.name = name

    def crash(self, feeder, csplice, size: int = 1 << 20, pid: int = 4242, keep_core: bool = True, **kw) -> dict:
        record = feed(feeder, csplice, self.csplice_settings, size=size, pid=pid, **kw)
        if keep_core:  # ingest deletes the raw core: keep its bytes to compare with what comes back
            record["_sha256"] = hashlib.sha256((self.state / "spool" / record["core"]).read_bytes()).hexdigest()
        return record

    def uploader(self, **over) -> upload.Uploader:
        return upload.Uploader(UploadConfig.model_validate({**self.upload, **over}), self.state)

    def upload_all(self, n: int = 1, timeout: float = 60) -> None:
        """Runs the daemon with its uploader until n dumps are up."""
        with Running(self.settings, [self.uploader()]):
            wait_for(lambda: self.done() == n, what="the dump uploaded", timeout=timeout)

    def queue(self) -> dict | None:
        """The upload queue's stats; None before the daemon made the index and its queue."""
        if not (self.state / "index.sqlite").exists():
            return None
        with Store(self.state, readonly=True) as store:
            return upload_queue.stats(store.db)

    def done(self) -> int:
        st = self.queue()
        return st["states"]["done"] if st else 0

    def failures(self) -> int:
        st = self.queue()
        return sum(st["failures"].values()) if st else 0

    def cli(self, capsys, *args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        cache = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = str(self.root / "cache")  # fleet list's sidecar cache, not root's
        try:
            code = main(["--config-dir", str(self.config_dir), "--state-dir", str(self.state), *args])
        finally:
            if cache is None:
                del os.environ["XDG_CACHE_HOME"]
            else:
                os.environ["XDG_CACHE_HOME"] = cache
        out, err = capsys.readouterr()
        return code, out, err


def sha_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dump_keys(s3, bucket: str, dump_id: str) -> list[str]:
    """The dump's core and sidecar keys (v2 layout), sorted; its mini core, a small object of its own, left out."""
    return [k for k in s3.keys(bucket, "fleet/v2/dt=") if dump_id in k and ".mini.core" not in k]


def store_with_dump(state: Path, dump_id: str, payload: bytes, **record) -> Path:
    """A state dir whose store holds one dump (its core the zstd of payload; `record` adds to its spool
    record, e.g. uid), queued for upload; its file."""
    import zstandard

    (state / "store").mkdir(parents=True)
    path = state / "store" / f"{dump_id}.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(payload))
    record = {"id": dump_id, "signal": 6, "timestamp": time.time(), "proc": {"exe": "/usr/bin/x"}, "capture": {},
              **record}
    with Store(state) as store:
        store.insert(row_from_record(record, status="ok", problem=None, path=f"{dump_id}.zst", raw_bytes=len(payload),
                                     stored_bytes=0, sha256=hashlib.sha256(payload).hexdigest()))
        upload_queue.ensure_schema(store.db)
        upload_queue.enqueue(store.db, dump_id)
    return path
