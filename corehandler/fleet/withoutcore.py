"""Why a dump went up without its core: the sidecar's `no_core` ({reason, why}), written by the uploader when it
sends a sidecar with no core, and read back by every fleet view (the index's `no_core_reason` and
`no_core_why`, `fleet list`, `info`, `get`).

reason is one of:
  send_metadata      this host sends sidecars only ([upload] send = "metadata")
  fleet_budget       the fleet budget of full cores for the dump's signature and crash day was spent
  capture:REASON     csplice kept no core (REASON as the record says it: max_per_exe_per_minute, max_dump_size,
                     min_free, max_pending, rlimit_core, ...); `why` is nocore.py's sentence
  invalid            the captured core was not an ELF core the daemon could store
  removed            retention removed the full core before it went up (the mini core stayed)
  unknown            a sidecar of before `no_core` existed, whose fields tell nothing more
why is one sentence for a person. A sidecar is another host's word: what it says is cut to MAX_REASON and
MAX_WHY characters, and one of an older corehandler (no `no_core`) is given what its budget, status and
record tell (fleet_budget, capture:REASON, invalid), else unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corehandler import fields, nocore
from corehandler.store.upload_queue import KEPT_BACK

SEND_METADATA = "send_metadata"
FLEET_BUDGET = "fleet_budget"
CAPTURE = "capture"
INVALID = "invalid"
REMOVED = "removed"
UNKNOWN = "unknown"

MAX_REASON = 64
MAX_WHY = 1000

# What an index row of before `no_core_reason` existed (index schema 1) tells of a dump without its core, as the
# fleet view fills it in (fleetview.py): the budget's and the status's words, nothing of the record.
OLD_ROWS = (
    ("budget = 'kept_back'", FLEET_BUDGET, "the fleet budget of its signature on its crash day was spent "
                                           "(fleet_budget)"),
    ("status = 'dropped'", CAPTURE, "csplice kept no core (the dump was dropped at capture; `fleet info` "
                                    "may tell why)"),
    ("status = 'invalid'", INVALID, "the captured core was not an ELF core its host could store"),
)
UNKNOWN_WHY = ("its host did not record why (an older corehandler): [upload] send = \"metadata\", or the core "
               "was gone from its store")


def at_upload(dump, *, send: str, budget: str | None, fleet_budget: int, per_uid: int, signature: str,
              crash_day: str) -> dict:
    """Why the uploader sends this dump's sidecar without its core (it has decided not to send one)."""
    if send != "cores":
        return {"reason": SEND_METADATA, "why": "its host sends sidecars only ([upload] send = \"metadata\")"}
    if dump.path is None:
        return _from_store(dump.status, dump.record, dump.problem)
    if budget == KEPT_BACK:
        pool = (f"the {fleet_budget} full cores a day that root's crashes have" if dump.uid == 0 else
                f"the {fleet_budget} full cores a day of the fleet, at most {per_uid} of them for one user "
                "of a host")
        return {"reason": FLEET_BUDGET, "why": f"the fleet budget of signature {signature!r} on {crash_day} was "
                                               f"spent ([upload] fleet_budget: {pool})"}
    return {"reason": UNKNOWN, "why": UNKNOWN_WHY}


def _from_store(status, record, problem) -> dict:
    """A dump its host's store holds no full core of."""
    if status == "dropped":
        try:
            said = nocore.explain(record if isinstance(record, Mapping) else {})
        except Exception:  # noqa: BLE001 (another host's record, in any shape: the coarser words instead)
            said = None
        cause = fields.outcome(record)[1] if isinstance(record, Mapping) else ""
        if said:
            return {"reason": f"{CAPTURE}:{said['reason']}", "why": f"{said['why']}; {said['fix']}"}
        return {"reason": f"{CAPTURE}:{cause}" if cause else CAPTURE, "why": OLD_ROWS[1][2]}
    if status == "invalid":
        return {"reason": INVALID, "why": "the captured core was not an ELF core its host could store"
                                          + (f" ({problem})" if problem else "")}
    return {"reason": REMOVED, "why": "retention on its host removed the full core before it went up (the mini "
                                      "core stayed: fleet get --mini)"}


def _cut(value: Any, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def of_sidecar(sc: Mapping[str, Any]) -> dict | None:
    """The sidecar's {reason, why} when its core is not in the bucket, None when it has one."""
    if sc.get("core") is not None:
        return None
    said = sc.get("no_core")
    if isinstance(said, Mapping) and _cut(said.get("reason"), MAX_REASON):
        return {"reason": _cut(said["reason"], MAX_REASON), "why": _cut(said.get("why"), MAX_WHY) or UNKNOWN_WHY}
    if sc.get("budget") == KEPT_BACK:
        return {"reason": FLEET_BUDGET, "why": OLD_ROWS[0][2]}
    index = sc.get("index") if isinstance(sc.get("index"), Mapping) else {}
    status = index.get("status")
    if status in ("dropped", "invalid"):
        found = _from_store(status, sc.get("record"), None)
        return {"reason": found["reason"][:MAX_REASON], "why": found["why"][:MAX_WHY]}
    return {"reason": UNKNOWN, "why": UNKNOWN_WHY}


def label(reason: str | None) -> str:
    """A few words for a table's cell."""
    if not reason:
        return "sidecar only"
    if reason.startswith(CAPTURE + ":"):
        return "dropped: " + reason.split(":", 1)[1]
    return {SEND_METADATA: "send=metadata", FLEET_BUDGET: "fleet budget", CAPTURE: "dropped", INVALID: "invalid core",
            REMOVED: "removed", UNKNOWN: "sidecar only"}.get(reason, reason)
