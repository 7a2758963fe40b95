"""A line per crash in the daemon's own log, where no journal takes the dump's entry (the node agent's pod,
a daemon with [journal] off): who crashed (exe, signal, uid), where (pod, namespace, container, node) and
what (signature, status; a pod's core policy and the pod labels the config records), in the message for a
person and as fields for a log pipeline (observe/logformat.py's JSON lines). Names are the crashed process's and
its container's: each through the one escaper."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from corehandler import fields
from corehandler.observer import Quiet, Stored
from corehandler.printable import display
from corehandler.store.dumprow import COMPRESSING

log = logging.getLogger("corehandler.crash")

IDENTITY = ("pod_namespace", "pod_name", "container_name", "container_id", "runtime", "unit")


class CrashLog(Quiet):
    def __init__(self, node: str | None = None):
        self.node = node if node is not None else (os.environ.get("NODE_NAME") or None)

    # Once per dump, when its figures are final: at listing for a dump with nothing to store (dropped), else
    # once stored and analysed (on_stored carries the analysis: pod, container, signature).
    def on_ingested(self, record: Mapping[str, Any], stored: Stored) -> None:
        if stored.get("status") != COMPRESSING:
            self._log(record, stored)

    def on_stored(self, record: Mapping[str, Any], stored: Stored) -> None:
        self._log(record, stored)

    def _log(self, record: Mapping[str, Any], stored: Mapping[str, Any]) -> None:
        f = crash_fields(record, stored, self.node)
        log.info(*message(f), extra={"fields": f})


def crash_fields(record: Mapping[str, Any], stored: Mapping[str, Any], node: str | None) -> dict[str, Any]:
    analysis = stored.get("analysis") or {}
    ident = analysis.get("identity") if isinstance(analysis.get("identity"), Mapping) else {}
    signal = fields.signal_number(record)
    out: dict[str, Any] = {
        "dump_id": stored.get("id"), "exe": fields.exe(record), "signal": signal,
        "signal_name": fields.signal_name(signal), "pid": record.get("pid"), "uid": record.get("uid"),
        "status": stored.get("status"), "problem": stored.get("problem"),
        "signature": analysis.get("signature"), "signature_id": analysis.get("signature_id"), "node": node,
    }
    out.update((key, ident.get(key)) for key in IDENTITY)
    kube = record.get("kubernetes") if isinstance(record.get("kubernetes"), Mapping) else {}
    out["core_policy"] = kube.get("core") if isinstance(kube.get("core"), str) else None
    labels = kube.get("pod_labels")
    if isinstance(labels, Mapping) and labels:
        out["pod_labels"] = {display(str(k)): display(v) for k, v in labels.items() if isinstance(v, str)}
    return {k: display(v) if isinstance(v, str) else v for k, v in out.items() if v is not None}


def message(f: Mapping[str, Any]) -> tuple:
    """(format, *args) of the text a person reads, from crash_fields."""
    where = f"pod {f['pod_namespace']}/{f['pod_name']}" if "pod_name" in f else f.get("unit") or "the host"
    if "container_name" in f:
        where += f" container {f['container_name']}"
    return ("Crash %s: %s (%s, uid %s) in %s%s: %s%s", f.get("dump_id"), f.get("exe", "?"),
            f.get("signal_name", "?"), f.get("uid", "?"), where, f" on {f['node']}" if "node" in f else "",
            f.get("status", "?"), f" ({f['signature']})" if "signature" in f else "")
