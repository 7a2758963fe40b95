"""Why a crash has no core (or a cut one), in one sentence with what the admin can do (README.md, "Why is there
no core?").

csplice records the reason a dump was dropped or truncated (the record's `capture.dropped_reason` /
`truncated_reason`: admit.c, capture.c, csplice.c) and the facts around it (`rlimit_core`, `capture.error`,
`capture.socket.error`); this module turns each into words for `info`, `list`, the journal and `--json`. A
process the kernel never hands to us (not dumpable: PR_SET_DUMPABLE 0, or setuid with `fs.suid_dumpable=0`)
leaves no record at all, so nothing here can speak of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corehandler import fields
from corehandler.analysis import identity
from corehandler.units import format_size

CONFIG = "/etc/corehandler/corehandler.toml"


def _rlimit(record: Mapping[str, Any], kind: str) -> tuple[str, str]:
    ident = identity.identify(dict(record))
    unit = ident.get("user_unit") or ident.get("unit")
    value = record.get("rlimit_core")
    limit = "0" if value in ("0", "1", None) else format_size(int(value)) if str(value).isdigit() else str(value)
    where = (f"LimitCORE= of {unit}, or a `ulimit -c` in what started it" if unit and unit != "init.scope"
             else "a `ulimit -c` in what started it, or its service's LimitCORE=")
    why = (f"the process's RLIMIT_CORE was {limit} ({where}): it asked for no core" if kind == "dropped" else
           f"the core was cut at the process's RLIMIT_CORE of {limit} ({where})")
    fix = (f"`systemctl edit {unit}` and set LimitCORE=infinity under [Service]" if unit and unit.endswith(".service")
           else "run it with `ulimit -c unlimited`, or LimitCORE=infinity in its unit (DefaultLimitCORE= in "
           "/etc/systemd/system.conf for every unit)")
    return why, fix


def _config(key: str) -> str:
    return f"[capture] {key} in {CONFIG}, then `systemctl reload corehandler`"


def _sentences(reason: str, kind: str, record: Mapping[str, Any]) -> tuple[str, str]:
    cap = fields.capture(record)
    error = cap.get("error")
    if reason == "rlimit_core":
        return _rlimit(record, kind)
    if reason == "max_dump_size":
        return (("the dump was larger than [capture] max_dump_size: " +
                 ("refused before it was written" if kind == "dropped" else "the core was cut there")),
                f"raise {_config('max_dump_size')}")
    if reason == "min_free":
        return ("the spool's filesystem was down to its free-space floor ([capture] min_free)",
                "free space on the state directory's filesystem (`corehandler vacuum`, `df`), or lower "
                + _config("min_free"))
    if reason == "max_pending":
        return ("[capture] max_pending dumps were already waiting in the spool for the daemon",
                "check the daemon is running and keeping up (`corehandler status`), or raise " + _config("max_pending"))
    if reason == "max_pending_per_uid":
        return ("this user already had [capture] max_pending_per_uid dumps waiting in the spool (a crash storm of "
                "their own processes; other users' and root's crashes keep their cores)",
                "check the daemon keeps up (`corehandler status`) and stop the user's crash loop, or raise "
                + _config("max_pending_per_uid"))
    if reason == "max_per_exe_per_minute":
        return ("crash storm: this user's executable crashed more than [capture] max_per_exe_per_minute times "
                "within a minute; the first ones of the minute have their cores",
                "fix the crash loop (its unit's Restart=), or raise " + _config("max_per_exe_per_minute"))
    if reason == "timeout":
        return ("the capture ran into [capture] timeout", "raise " + _config("timeout"))
    if reason == "write_error" and error and "space" in str(error).lower():
        return ("disk full: writing the core into the spool failed (" + str(error) + ")",
                "free space on the state directory's filesystem (`corehandler vacuum`, `df`)")
    if reason in ("write_error", "create_failed"):
        return (f"writing the core into the spool failed ({error or 'no error recorded'})",
                "check the state directory's filesystem (`corehandler doctor`, the kernel log)")
    if reason == "read_error":
        return (f"reading the core from the kernel failed ({error or 'no error recorded'})",
                "see the kernel log (`journalctl -k`) around the crash")
    if reason == "empty":
        return ("the kernel sent no byte of the core (its coredump_filter or the kernel's own limits left "
                "nothing to write)", "check /proc/PID/coredump_filter of such processes (0x33 is the default)")
    if reason == "pod_policy":
        kube = record.get("kubernetes") if isinstance(record.get("kubernetes"), Mapping) else {}
        by = {"annotation": "the pod's corehandler.io/core annotation",
              "namespace": "its namespace's setting ([kubernetes] metadata_namespaces)"}.get(
            kube.get("core_source"), "the default for pods ([kubernetes] core)")
        return (f"the pod's crashes keep metadata only, by {by}: the core was deleted before it was read",
                "annotate the pod corehandler.io/core: full where [kubernetes] pod_annotation allows it, or "
                "change the chart's corePolicy values")
    if reason == "socket_error":
        sock = cap.get("socket")
        detail = sock.get("error") if isinstance(sock, Mapping) else None
        return (f"the coredump socket connection failed ({detail or 'no error recorded'})",
                "see `corehandler doctor` and the kernel log; `corehandler install --mode pipe` avoids the socket")
    return (f"csplice recorded `{reason}`", "see `corehandler doctor` and the kernel log")


def explain(record: Mapping[str, Any]) -> dict | None:
    """{kind: dropped | truncated, reason, why, fix} for a dump without its whole core; None for a complete
    one (or a record that says nothing either way)."""
    outcome, reason = fields.outcome(record)
    if outcome == fields.DROPPED:
        kind = "dropped"
    elif outcome == fields.TRUNCATED:
        kind = "truncated"
    else:
        return None
    why, fix = _sentences(reason, kind, record)
    return {"kind": kind, "reason": reason, "why": why, "fix": fix}


def line(record: Mapping[str, Any]) -> str | None:
    """The sentence and the fix as one line (the journal's MESSAGE)."""
    e = explain(record)
    return f"{e['why'][0].upper()}{e['why'][1:]}. What to do: {e['fix']}." if e else None
