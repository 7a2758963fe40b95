"""fleet: every host's dumps, from the bucket [upload] names: `fleet list [--group]`, `fleet query SQL`,
`fleet info ID`, `fleet get ID -o FILE [--identity FILE]`. Reads the bucket's index files and sidecars with an
embedded engine; needs no daemon and no database server."""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import sqlite3
import sys
from pathlib import Path

from corehandler.analysis import pyframes
from corehandler.cli.common import emit, load, table, write_output
from corehandler.cli.progress import Progress
from corehandler.errors import CorehandlerError, NoMatchError, UsageError
from corehandler.fleet import available, bucket, dataset, fleetview, reader, report, seal, withoutcore
from corehandler.printable import display
from corehandler.units import human_size


def register(commands) -> None:
    p = commands.add("fleet", _usage, help="every host's dumps, read from the bucket of [upload]")
    sub = p.add_subparsers(dest="fleet_command", metavar="VERB")
    common = commands.common()

    days = argparse.ArgumentParser(add_help=False)
    days.add_argument("--date", type=_date, default=None, metavar="YYYY-MM-DD",
                      help="the (last) day, UTC (default today)")
    days.add_argument("--days", type=int, default=1, metavar="N", help="N days ending at --date (default 1)")
    days.add_argument("--host", action="append", default=[], metavar="HOST", help="only this host (repeatable)")
    days.add_argument("--no-cache", action="store_true", help="read every index file and sidecar from the "
                      "bucket, not the local cache of those read before (~/.cache/corehandler; as root the state "
                      "dir's cache/)")

    lst = sub.add_parser("list", parents=[common, days], help="one row per dump (--group: per signature)")
    lst.set_defaults(handler=run_list)
    lst.add_argument("--group", action="store_true", help="one row per signature: count, cores, hosts, "
                     "first and last seen")

    query = sub.add_parser("query", parents=[common, days], help="SQL over the table `dumps` of those days "
                           "(DuckDB; columns: docs/fleet-query.md)")
    query.set_defaults(handler=run_query)
    query.add_argument("sql", metavar="SQL", help="e.g. \"SELECT signature, count(*) FROM dumps GROUP BY 1\"")

    report = sub.add_parser("report", parents=[common, days], help="the fleet at a glance: top signatures with a "
                            "plot per day, first/last seen, hosts; one self-contained HTML file (--json: the data)")
    report.set_defaults(handler=run_report)
    report.add_argument("--top", type=int, default=50, metavar="N", help="the N most frequent signatures "
                        "(default 50)")
    report.add_argument("--new-since", type=_date, default=None, metavar="YYYY-MM-DD", help="mark signatures "
                        "first seen on or after this day (a release's) as new; --days must reach back before it")
    report.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the page here (default: "
                        "stdout, if not a terminal)")

    compact = sub.add_parser("compact", parents=[common, days], help="merge each day's index files into one "
                             "(idempotent; any host or an admin, for closed days)")
    compact.set_defaults(handler=run_compact)

    info = sub.add_parser("info", parents=[common], help="a dump's sidecar: record, index row, trace")
    info.set_defaults(handler=run_info)
    info.add_argument("id", metavar="ID")
    info.add_argument("--host", default=None, metavar="HOST", help="the host, when the id is on several")
    info.add_argument("--identity", type=Path, metavar="FILE", help="age identity file: show the sealed "
                      "fields (command line, environment, maps) of an encrypted sidecar")

    get = sub.add_parser("get", parents=[common], help="download a dump's core, verified, decompressed")
    get.set_defaults(handler=run_get)
    get.add_argument("id", metavar="ID")
    get.add_argument("--mini", action="store_true", help="the mini core (notes and stacks; uploaded for every "
                     "dump, also those the budget kept the core of)")
    get.add_argument("--host", default=None, metavar="HOST", help="the host, when the id is on several")
    get.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here (default: stdout, if not "
                     "a terminal)")
    get.add_argument("--identity", type=Path, metavar="FILE", help="age identity file (age-keygen's) that "
                     "opens an encrypted core: one of [upload] recipients when it went up")


def _escaped(handler):
    """A verb whose errors name keys and values another host chose (a sidecar's core key, a skipped object):
    its error line goes through the escaper too. Every fleet verb needs the fleet's libraries: without them
    (the host package alone) it stops in one line naming what to install."""
    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        available.require(f"fleet {args.fleet_command}")
        try:
            return handler(args)
        except CorehandlerError as e:
            e.message = display(e.message)
            raise
    return run


def _usage(args: argparse.Namespace) -> int:
    raise UsageError("fleet needs a verb: list, query, report, compact, info or get")


def _date(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (YYYY-MM-DD)") from None


def _open(args: argparse.Namespace):
    config, _ = load(args)
    target = bucket.target(config.upload)
    return bucket.client(config.upload, pool=reader.WORKERS + 4), target, config.upload


def _when(ts: float | None) -> str:
    return "-" if ts is None else dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _days(args: argparse.Namespace) -> list[dt.date]:
    if args.days < 1:
        raise UsageError("--days must be at least 1")
    last = args.date or dt.datetime.now(dt.timezone.utc).date()
    return [last - dt.timedelta(days=n) for n in range(args.days - 1, -1, -1)]


def _view(args: argparse.Namespace):
    """The fleet view of the days asked for; each object left out is named on stderr."""
    days = _days(args)
    client, target, upload = _open(args)
    cache = None if args.no_cache else _cache(target, upload.endpoint, load(args)[1].state_dir)
    try:
        view = fleetview.collect(client, target, days, args.host, cache=cache)
    finally:
        if cache:
            cache.close()
    for why in view.skipped:
        print(f"corehandler: skipped {display(why)}", file=sys.stderr)
    return view, target, days, client


def _text(value) -> str:
    return "-" if value is None else display(str(value))


def _core_cell(r: dict) -> str:
    if r["core_missing"]:
        return "MISSING"
    if r["core"]:
        return human_size(r["core_bytes"] or 0) + (" age" if r["encrypted"] else "")
    return _text(withoutcore.label(r["no_core_reason"]))


@_escaped
def run_list(args: argparse.Namespace) -> int:
    view, target, days, client = _view(args)
    try:
        con = fleetview.link(view.connect()) if args.group else view.connect()
        columns, values = fleetview.rows(con, fleetview.GROUP_SQL if args.group else fleetview.LIST_SQL)
    finally:
        view.close()
    found = fleetview.as_dicts(columns, values)
    if args.group:
        rows = [("COUNT", "CORES", "HOSTS", "FIRST (UTC)", "LAST (UTC)", "LATEST", "SIGNATURE")]
        rows += [(str(g["count"]), str(g["cores"]), str(len(g["hosts"])), _when(g["first_seen"]),
                  _when(g["last_seen"]), _text(g["latest"]), _text(g["signature"])) for g in found]
    else:
        # The index says a core went up; whether it is still there, one listing per host's day shown tells.
        missing = reader.missing_cores(client, target, found)
        for r in found:
            r["core_missing"] = r["key"] in missing
        rows = [("TIME (UTC)", "HOST", "ID", "CORE", "EXE")]
        rows += [(_when(r["crashed_at"]), _text(r["host"]), _text(r["id"]), _core_cell(r),
                  _text(r["exe"] or r["comm"])) for r in found]
    emit(args, found, table(rows) if found else "")
    if not found:
        raise NoMatchError(f"no dumps in s3://{target.bucket}/{target.prefix} for "
                           f"{days[0]}{'' if len(days) == 1 else f'..{days[-1]}'}")
    return 0


@_escaped
def run_query(args: argparse.Namespace) -> int:
    import duckdb

    view, _, _, _ = _view(args)
    try:
        try:
            columns, values = fleetview.rows(view.connect(), args.sql)
        except duckdb.Error as e:
            raise UsageError(f"fleet query: {str(e).splitlines()[0]}") from None
    finally:
        view.close()
    found = fleetview.as_dicts(columns, values)
    emit(args, found, table([tuple(columns)] + [tuple(_text(v) for v in row) for row in values]))
    return 0


@_escaped
def run_report(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise UsageError("--top must be at least 1")
    view, target, days, _ = _view(args)
    try:
        data = report.collect(view.connect(), days, args.top, args.new_since, f"s3://{target.bucket}/{target.prefix}",
                              view.skipped)
    finally:
        view.close()
    if args.json:
        emit(args, data, "")
        return 0
    text = report.page(data).encode()
    write_output(args.output, lambda out: out.write(text))
    return 0


@_escaped
def run_compact(args: argparse.Namespace) -> int:
    client, target, upload = _open(args)
    sse = bucket.sse_args(upload)
    done = []
    for day in _days(args):
        try:
            key, count, skipped = dataset.compact(client, target, day, sse)
        except Exception as e:
            raise bucket.classify(e) from e
        for why in skipped:
            print(f"corehandler: skipped {display(why)}", file=sys.stderr)
        done.append({"day": str(day), "key": key, "rows": count, "skipped": len(skipped)})
    emit(args, done, "\n".join(f"{d['day']}: " + (f"{d['rows']} rows in s3://{target.bucket}/{d['key']}"
                                                    if d["key"] else "no index files") for d in done))
    return 0


def _cache(target, endpoint: str, state_dir: Path) -> "reader.SidecarCache | None":
    try:
        return reader.SidecarCache(reader.SidecarCache.default_path(target, endpoint, state_dir))
    except (OSError, sqlite3.Error) as e:  # a read-only home: list without one
        print(f"corehandler: no sidecar cache ({e}); reading every sidecar", file=sys.stderr)
        return None


@_escaped
def run_info(args: argparse.Namespace) -> int:
    identities = seal.load_identities(args.identity) if args.identity else None
    client, target, _ = _open(args)
    sc = reader.find(client, target, args.id, args.host)
    if identities:
        sc = seal.unseal(sc, identities)
    r = reader.row(sc)
    missing = reader.core_missing(client, target, r)
    if args.json:
        emit(args, dict(sc, core_missing=missing, no_core_reason=r["no_core_reason"], no_core_why=r["no_core_why"]),
             "")
        return 0
    # A sidecar is any host's word, and its names a crashed process's: every value escaped (printable.py),
    # every size and shape taken only as the index row types it (dataset.row).
    lines = [f"ID:        {display(r['id'])}", f"Host:      {display(r['host'])}",
             f"Crashed:   {_when(r['crashed_at'])} UTC", f"Exe:       {display(r['exe']) or '-'}",
             f"Signal:    {display(r['signal'])}", f"Status:    {display(r['status'])}",
             f"Signature: {display(r['signature'])} ({display(sc.get('signature_source'))})",
             "Core:      " + (f"s3://{target.bucket}/{display(sc['core'].get('key'))} "
                               f"({human_size(r['core_bytes'] or 0)}, {human_size(r['raw_bytes'] or 0)} decompressed)"
                               + (": MISSING from the bucket (deleted since it was uploaded)" if missing else "")
                               if r["core"] and isinstance(sc["core"], dict) else
                               f"none: {display(r['no_core_why'])} ({display(r['no_core_reason'])})"),
             f"Sidecar:   s3://{target.bucket}/{display(sc['_key'])}"]
    sealed = sc.get("sealed")
    if isinstance(sealed, dict):
        count = len(sealed["recipients"]) if isinstance(sealed.get("recipients"), list) else 0
        fields = sealed["fields"] if isinstance(sealed.get("fields"), list) else []
        lines.append(f"Encrypted: age, to {count} recipient(s); sealed: "
                     f"{display(', '.join(map(str, fields))) or 'nothing'} (--identity FILE shows them)")
    crashing, frames = dataset.crashing_frames(sc)
    if crashing:
        lines.append(f"Stack of thread {display(crashing.get('tid'))} (docs/analysis.md):")
        lines += [f"  #{display(f.get('index'))} {display(f.get('function')) or '??'} "
                  f"({display(f.get('module')) or '?'}+{display(f.get('offset'))})" for f in frames]
    analysis = sc.get("analysis") if isinstance(sc.get("analysis"), dict) else {}
    if isinstance(analysis.get("python"), dict) and analysis["python"].get("state") == "ok" and crashing:
        python = pyframes.crashing({"python": pyframes.checked(analysis["python"], crashing.get("tid"))})
        if python:
            lines += pyframes.traceback_lines(python)
    print("\n".join(lines))
    return 0


@_escaped
def run_get(args: argparse.Namespace) -> int:
    # Before anything is written: a missing or unreadable identity leaves no file behind.
    identities = seal.load_identities(args.identity) if args.identity else None
    client, target, _ = _open(args)
    sc = reader.find(client, target, args.id, args.host)
    r = reader.row(sc)  # sizes as the index types them: the sidecar is another host's word
    workdir = args.output.absolute().parent if args.output else None
    if args.mini:
        write_output(args.output, lambda out: reader.fetch_mini(client, target, sc, output=out, identities=identities))
        print(f"wrote the mini core of {display(r['id'])} from {display(r['host'])} to {args.output or 'stdout'}",
              file=sys.stderr)
        return 0

    def write(out) -> None:
        # One bar over both steps: the download, then the decompression.
        with Progress((r["core_bytes"] or 0) + (r["raw_bytes"] or 0), display(r["id"])) as progress:
            reader.fetch_core(client, target, sc, output=out, progress=progress, workdir=workdir,
                              identities=identities)

    write_output(args.output, write)
    print(f"wrote {display(r['id'])} from {display(r['host'])} ({human_size(r['raw_bytes'] or 0)}) to "
          f"{args.output or 'stdout'}", file=sys.stderr)
    return 0
