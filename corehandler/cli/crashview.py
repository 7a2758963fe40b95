"""What `list` and `info` show of a dump's analysis (corehandler/analysis/unwind.py): the signature column,
`list --group`, the filters --signature/--unit/--container/--pod, and info's trace, keys, build-ids and
identity, in coredumpctl's layout. cli/dumps.py calls these; they know nothing of its other columns."""

from __future__ import annotations

import argparse
import datetime as dt

from corehandler import nocore
from corehandler.analysis import pyframes
from corehandler.cli import common
from corehandler.printable import display
from corehandler.store.dumprow import Dump
from corehandler.store.dumps import Dumps

TRACE_INDENT = " " * 16


def add_filter_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--signature", metavar="SIG", help="only dumps of this signature (its id, an id prefix, or "
                   "its exact text) or exact key")
    p.add_argument("--unit", metavar="UNIT", help="only dumps of processes in this systemd unit")
    p.add_argument("--container", metavar="ID", help="only dumps of processes in this container (id prefix, "
                   "or its name)")
    p.add_argument("--pod", metavar="POD", help="only dumps of processes in this pod (uid or name)")


def add_list_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group", action="store_true", help="one line per signature: count, hosts, units, first "
                   "and last seen")


def add_info_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--all-threads", action="store_true", help="show every thread's stack, not only the "
                   "crashing one's")


def filtering(args: argparse.Namespace) -> bool:
    return any(getattr(args, k, None) for k in ("signature", "unit", "container", "pod"))


def _matches(args: argparse.Namespace, a: dict | None, ident: dict) -> bool:
    if a is None:
        return False
    if args.signature:
        s = args.signature
        # The v1 id too: what was noted down, alerted on or sent to the fleet before signature v2.
        if not (a["signature"] == s or a["exact_key"] == s
                or any((a.get(k) or "").startswith(s) for k in ("signature_id", "exact_key", "signature_v1_id"))):
            return False
    if args.unit and args.unit not in (a["unit"], ident.get("unit"), ident.get("user_unit")):
        return False
    if args.container:
        c = args.container
        if not ((a["container_id"] or "").startswith(c) or ident.get("container_name") == c
                or ident.get("machine") == c):
            return False
    if args.pod and args.pod not in (a["pod_uid"], a["pod_name"]):
        return False
    return True


def apply_filters(args: argparse.Namespace, store: Dumps, dumps: list[Dump], last: int | None) -> list[Dump]:
    """The dumps the analysis filters keep; `last` (-n) applies after them."""
    if not filtering(args):
        return dumps
    rows = store.analysis_summaries([d.id for d in dumps])
    kept = []
    for d in dumps:
        a = rows.get(d.id)
        ident = (store.analysis_for(d.id) or {}).get("identity") or {} if a else {}
        if _matches(args, a, ident):
            kept.append(d)
    return kept[-last:] if last else kept


# -- list ---------------------------------------------------------------------------------------------------

def signatures(dumps: Dumps, found: list[Dump]) -> dict[str, dict]:
    return dumps.analysis_summaries([d.id for d in found])


def signature_cell(row: dict | None, record: dict | None = None) -> str:
    """The signature id; for a dump whose core was not kept, why (`no core: rlimit_core`): nothing was analysed."""
    missing = nocore.explain(record or {})
    if (row is None or not row["signature_id"]) and missing and missing["kind"] == "dropped":
        return f"no core: {missing['reason']}"
    if row is None:
        return "-"
    return row["signature_id"] or row["state"]


def nocore_fields(record: dict) -> list[tuple[str, str | None]]:
    """info's lines for a dump without its whole core: why, and what to do (nocore.py)."""
    missing = nocore.explain(record)
    if missing is None:
        return []
    return [("No Core" if missing["kind"] == "dropped" else "Core Cut", missing["why"]), ("What To Do", missing["fix"])]


def list_json(row: dict | None) -> dict:
    keys = ("state", "signature", "signature_id", "signature_v1_id", "exact_key", "unit", "container_id", "pod_uid",
            "runtime", "reason")
    return {f"analysis_{k}" if k == "state" else k: (row or {}).get(k) for k in keys}


def groups(dumps: list[Dump], rows: dict[str, dict]) -> list[dict]:
    """One entry per signature (dumps without one grouped by their analysis state), most frequent first."""
    out: dict[str, dict] = {}
    for d in dumps:
        a = rows.get(d.id) or {}
        key = a.get("signature_id") or f"({a.get('state') or 'not analysed'})"
        g = out.setdefault(key, {"signature_id": a.get("signature_id"), "signature": a.get("signature"),
                                 "count": 0, "hosts": set(), "units": set(), "exact_keys": set(),
                                 "signature_v1_ids": set(),
                                 "first_seen": d.crashed_at, "last_seen": d.crashed_at, "ids": []})
        g["count"] += 1
        g["ids"].append(d.id)
        if d.hostname:
            g["hosts"].add(d.hostname)
        if a.get("unit"):
            g["units"].add(a["unit"])
        if a.get("exact_key"):
            g["exact_keys"].add(a["exact_key"])
        if a.get("signature_v1_id"):  # the v1 groups this one links (docs/analysis.md, "Grouping keys")
            g["signature_v1_ids"].add(a["signature_v1_id"])
        g["first_seen"] = min(g["first_seen"], d.crashed_at)
        g["last_seen"] = max(g["last_seen"], d.crashed_at)
    result = []
    for key, g in out.items():
        g["hosts"], g["units"] = sorted(g["hosts"]), sorted(g["units"])
        g["exact_keys"] = len(g["exact_keys"])
        g["signature_v1_ids"] = sorted(g["signature_v1_ids"])
        g["key"] = key
        result.append(g)
    return sorted(result, key=lambda g: (-g["count"], -g["last_seen"], g["key"]))


def _time(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def group_table(gs: list[dict], legend: bool = True) -> str:
    table = [("COUNT", "FIRST", "LAST", "HOSTS", "UNITS", "SIGNATURE ID", "SIGNATURE")]
    for g in gs:
        # Host names, units and signatures are the crashed processes' words: escaped (printable.py).
        table.append((str(g["count"]), _time(g["first_seen"]), _time(g["last_seen"]),
                      display(",".join(g["hosts"])) or "-", display(",".join(g["units"])) or "-",
                      display(g["signature_id"] or g["key"]), display(g["signature"]) or "-"))
    return common.table(table, legend)


# -- info ---------------------------------------------------------------------------------------------------

def trace_lines(result: dict, all_threads: bool) -> list[str]:
    """The crashing thread's trace (every thread's with all_threads), each with its Python frames under the
    eval frames that ran them (pyframes.py); a Python thread the unwinder did not give is shown alone."""
    out = []
    threads = result.get("threads") or []
    for t in threads if all_threads else threads[:1]:
        out += pyframes.thread_lines(t, pyframes.python_of(result, t.get("tid"))) + [""]
    native = {t.get("tid") for t in threads}
    for py in (result.get("python") or {}).get("threads") or []:
        if py.get("tid") not in native and (all_threads or (py.get("crashing") and not threads)):
            out += pyframes.traceback_lines(py) + [""]
    if not all_threads and len(threads) > 1:
        out.append(f"({len(threads) - 1} more threads: --all-threads shows them)")
    modules = result.get("modules") or []
    if modules:
        out.append("Modules:")
        for m in modules:
            # The paths and the package notes are the crashed program's: escaped (printable.py).
            package = ", ".join(f"{k}={display(str(v))}" for k, v in _package(result, m["name"]).items())
            out.append(f"  {display(m['name'])} build-id {display(m['build_id']) or '-'}"
                       + (f" ({package})" if package else "")
                       + (f", symbols: {m['symbols']}" if m.get("symbols") else ""))
    return out


def _package(result: dict, module: str) -> dict:
    p = (result.get("packages") or {}).get(module) or {}
    return {k: p[k] for k in ("name", "version", "architecture", "osDistribution") if k in p}


def info_fields(result: dict | None, full_core: bool | None = None) -> list[tuple[str, str | None]]:
    """(label, value) lines for info's header block; full_core: whether the full core is still stored."""
    if result is None:
        return [("Analysis", "none")]
    state = result.get("state")
    ident = result.get("identity") or {}
    exe = result.get("exe") or {}
    fields: list[tuple[str, str | None]] = [
        ("Analysis", f"{state}" + (f" in {result['seconds'] * 1000:.0f} ms" if result.get("seconds") else "")),
        ("Reason", (result.get("reason") or {}).get("text")),
        ("Python", pyframes.summary(result, full_core)),
        ("Signature", result.get("signature")),
        ("Signature ID", result.get("signature_id")),
        ("Signature v1 ID", result.get("signature_v1_id")),
        ("Exact Key", result.get("exact_key")),
        ("Build ID", (exe.get("build_id") or "-") + (f" ({exe['state']})" if exe.get("state") else "")
         if exe else None),
        ("Runtime", ident.get("runtime")),
        ("Container", ident.get("container_id")),
        ("Container Name", ident.get("container_name")),
        ("Image", ident.get("image")),
        ("Pod", " ".join(x for x in (ident.get("pod_namespace"), ident.get("pod_name")) if x) or None),
        ("Pod UID", ident.get("pod_uid")),
        ("Machine", ident.get("machine")),
        ("Unit", ident.get("unit")),
        ("User Unit", ident.get("user_unit")),
        ("Slice", ident.get("slice")),
        ("NSpid", " ".join(map(str, ident["nspid"])) if ident.get("nspid") and len(ident["nspid"]) > 1 else None),
    ]
    if result.get("core"):
        fields.append(("Analysed From", f"the {result['core']} core"))
    if isinstance(result.get("resymbolised_at"), (int, float)):
        fields.append(("Re-symbolised", f"{_time(result['resymbolised_at'])}, by the daemon once debug info came"))
    modules = result.get("modules") or []
    exe_module = next((m for m in modules if m.get("name") == exe.get("path")), None)
    if exe_module and exe_module.get("symbols"):
        fields.append(("Symbols", f"{exe_module['symbols']} (each module's: below, under Modules)"))
    for cut in result.get("cut") or []:
        fields.append(("Cut", cut))
    for p in result.get("problems") or []:
        fields.append(("Analysis Problem", p))
    return fields


def result(dumps: Dumps, d: Dump) -> dict | None:
    return dumps.analysis_for(d.id)


def info_json(dumps: Dumps, d: Dump) -> dict:
    return {"analysis": result(dumps, d)}
