"""How the daemon's log reads on stderr: text for a person (`LEVEL: message`), or JSON lines for a log pipeline
(Loki, Elasticsearch, Cloud Logging): one object per line with `time` (RFC 3339, UTC), `level`, `logger`,
`message`, and the fields a record carries (`extra={"fields": {...}}`: observe/crashlog.py's crash lines), so a
pipeline indexes crashes by pod, namespace, exe or signal without parsing the message.

`auto` picks JSON where the daemon runs as a Kubernetes pod (KUBERNETES_SERVICE_HOST, which the kubelet sets in
every container) and its stderr is not a terminal (`kubectl logs` reads the container runtime's log file),
text elsewhere."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys

FORMATS = ("auto", "text", "json")
TEXT_FORMAT = "%(levelname)s: %(message)s"


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds")
                 .replace("+00:00", "Z"), "level": record.levelname.lower(), "logger": record.name,
                 "message": record.getMessage()}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update((k, v) for k, v in fields.items() if k not in entry and v is not None)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        # ensure_ascii: a name that is not UTF-8 (a lone surrogate) or holds control bytes stays an escape.
        return json.dumps(entry, ensure_ascii=True, default=str)


def chosen(name: str, environ=os.environ, stream=sys.stderr) -> str:
    """text or json for the --log-format name."""
    if name != "auto":
        return name
    return "json" if environ.get("KUBERNETES_SERVICE_HOST") and not stream.isatty() else "text"


def setup(name: str, debug: bool = False, stream=sys.stderr) -> str:
    """Logs to stream in the chosen format; returns it (text or json)."""
    fmt = chosen(name, stream=stream)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLines() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, handlers=[handler])
    return fmt
