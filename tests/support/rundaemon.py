"""Runs the real corehandler Daemon on a test state dir, as a process tests can signal and SIGKILL.

Observer events are printed to stdout as JSON lines, so a test can see what the daemon reported.
usage: rundaemon.py STATE_DIR [--no-compression] [--level N] [--threads N] [--sweep SEC] [--retry SEC]
                    [--max-count N] [--attempts N] [--upload UPLOAD.json]
--upload adds the uploader (corehandler.fleet.upload.Uploader) with that [upload] section, given as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from corehandler.daemon import Daemon, Settings
from corehandler.observer import Quiet
from corehandler.store.retention import Policy


class PrintObserver(Quiet):
    def _emit(self, event, **fields):
        print(json.dumps({"event": event, **fields}, default=str), flush=True)

    def on_ingested(self, record, stored):
        self._emit("ingested", stored=dict(stored))

    def on_stored(self, record, stored):
        self._emit("stored", stored=dict(stored))

    def on_deleted(self, dump_id, exe, rule, freed_bytes):
        self._emit("deleted", id=dump_id, rule=rule)

    def on_error(self, kind, message, dump_id):
        self._emit("error", kind=kind, message=message, id=dump_id)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("state_dir", type=Path)
    p.add_argument("--no-compression", action="store_true")
    p.add_argument("--level", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sweep", type=float, default=30.0)
    p.add_argument("--retry", type=float, default=60.0)
    p.add_argument("--max-count", type=int, default=None)
    p.add_argument("--attempts", type=int, default=Settings.ingest_attempts)
    p.add_argument("--upload", type=Path, default=None)
    a = p.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s")
    settings = Settings(a.state_dir, compression=not a.no_compression, level=a.level, threads=a.threads,
                        policy=Policy(max_count=a.max_count), sweep_interval=a.sweep, retry_interval=a.retry,
                        ingest_attempts=a.attempts)
    observers = [PrintObserver()]
    if a.upload:
        from corehandler.config import UploadConfig
        from corehandler.fleet.upload import Uploader
        observers.append(Uploader(UploadConfig.model_validate(json.loads(a.upload.read_text())), a.state_dir))
    return Daemon(settings, observers=observers, handle_signals=True).run()


if __name__ == "__main__":
    sys.exit(main())
