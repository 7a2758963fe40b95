"""fleet: every host's dumps, from the bucket [upload] names: `fleet list [--group]`, `fleet info ID`,
`fleet get ID -o FILE`. Reads sidecars only; needs no daemon and no database server."""

from __future__ import annotations

import argparse
import datetime as dt
import sqlite3
import sys
from pathlib import Path

from corehandler.cli.common import emit, load, table, write_output
from corehandler.cli.progress import Progress
from corehandler.errors import NoMatchError, UsageError
from corehandler.fleet import bucket, reader
from corehandler.printable import display
from corehandler.units import human_size


def register(commands) -> None:
    p = commands.add("fleet", _usage, help="every host's dumps, read from the bucket of [upload]")
    sub = p.add_subparsers(dest="fleet_command", metavar="VERB")
    common = commands.common()

    lst = sub.add_parser("list", parents=[common], help="one row per dump (--group: per signature)")
    lst.set_defaults(handler=run_list)
    lst.add_argument("--date", type=_date, default=None, metavar="YYYY-MM-DD",
                     help="the (last) day to list, UTC (default today)")
    lst.add_argument("--days", type=int, default=1, metavar="N", help="list N days ending at --date (default 1)")
    lst.add_argument("--host", action="append", default=[], metavar="HOST", help="only this host (repeatable)")
    lst.add_argument("--group", action="store_true", help="one row per signature: count, cores, hosts, "
                     "first and last seen")
    lst.add_argument("--no-cache", action="store_true", help="read every sidecar from the bucket, not the "
                     "local cache of those read before (~/.cache/corehandler; as root the state dir's cache/)")

    info = sub.add_parser("info", parents=[common], help="a dump's sidecar: record, index row, trace")
    info.set_defaults(handler=run_info)
    info.add_argument("id", metavar="ID")
    info.add_argument("--host", default=None, metavar="HOST", help="the host, when the id is on several")

    get = sub.add_parser("get", parents=[common], help="download a dump's core, verified, decompressed")
    get.set_defaults(handler=run_get)
    get.add_argument("id", metavar="ID")
    get.add_argument("--mini", action="store_true", help="the mini core (notes and stacks; uploaded for every "
                     "dump, also those the budget kept the core of)")
    get.add_argument("--host", default=None, metavar="HOST", help="the host, when the id is on several")
    get.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here (default: stdout, if not "
                     "a terminal)")


def _usage(args: argparse.Namespace) -> int:
    raise UsageError("fleet needs a verb: list, info or get")


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


def run_list(args: argparse.Namespace) -> int:
    if args.days < 1:
        raise UsageError("--days must be at least 1")
    client, target, upload = _open(args)
    last = args.date or dt.datetime.now(dt.timezone.utc).date()
    days = [last - dt.timedelta(days=n) for n in range(args.days - 1, -1, -1)]
    cache = None if args.no_cache else _cache(target, upload.endpoint, load(args)[1].state_dir)
    try:
        sidecars = reader.list_sidecars(client, target, days, args.host, cache=cache)
    finally:
        if cache:
            cache.close()
    if args.group:
        groups = reader.group(sidecars)
        rows = [("COUNT", "CORES", "HOSTS", "FIRST (UTC)", "LAST (UTC)", "LATEST", "SIGNATURE")]
        rows += [(str(g["count"]), str(g["cores"]), str(len(g["hosts"])), _when(g["first_seen"]),
                  _when(g["last_seen"]), display(g["latest"]) or "-", display(g["signature"]) or "-")
                 for g in groups]
        emit(args, groups, table(rows) if groups else "")
    else:
        found = [reader.row(s) for s in sidecars]
        rows = [("TIME (UTC)", "HOST", "ID", "CORE", "EXE")]
        rows += [(_when(r["crashed_at"]), display(r["host"]) or "-", display(r["id"]) or "-",
                  human_size(r["core_bytes"]) if r["core"] else "sidecar only", display(r["exe"] or r["comm"]) or "-")
                 for r in found]
        emit(args, found, table(rows) if found else "")
    if not sidecars:
        raise NoMatchError(f"no dumps in s3://{target.bucket}/{target.root()} for "
                           f"{days[0]}{'' if len(days) == 1 else f'..{days[-1]}'}")
    return 0


def _cache(target, endpoint: str, state_dir: Path) -> "reader.SidecarCache | None":
    try:
        return reader.SidecarCache(reader.SidecarCache.default_path(target, endpoint, state_dir))
    except (OSError, sqlite3.Error) as e:  # a read-only home: list without one
        print(f"corehandler: no sidecar cache ({e}); reading every sidecar", file=sys.stderr)
        return None


def run_info(args: argparse.Namespace) -> int:
    client, target, _ = _open(args)
    sc = reader.find(client, target, args.id, args.host)
    if args.json:
        emit(args, sc, "")
        return 0
    r = reader.row(sc)
    core = sc.get("core")
    # A sidecar is any host's word, and its names a crashed process's: every value escaped (printable.py).
    lines = [f"ID:        {display(r['id'])}", f"Host:      {display(r['host'])}",
             f"Crashed:   {_when(r['crashed_at'])} UTC", f"Exe:       {display(r['exe']) or '-'}",
             f"Signal:    {display(r['signal'])}", f"Status:    {display(r['status'])}",
             f"Signature: {display(r['signature'])} ({display(sc.get('signature_source'))})",
             "Core:      " + (f"s3://{target.bucket}/{display(core.get('key'))} ({human_size(core['bytes'])}, "
                               f"{human_size(core['raw_bytes'] or 0)} decompressed)" if core else
                               f"none (budget: {display(sc.get('budget'))})"),
             f"Sidecar:   s3://{target.bucket}/{display(sc['_key'])}"]
    threads = (sc.get("analysis") or {}).get("threads") or []
    crashing = next((t for t in threads if t.get("crashing")), threads[0] if threads else None)
    if crashing:
        lines.append(f"Stack of thread {display(crashing.get('tid'))} (docs/analysis.md):")
        lines += [f"  #{display(f.get('index'))} {display(f.get('function')) or '??'} "
                  f"({display(f.get('module')) or '?'}+{display(f.get('offset'))})"
                  for f in crashing.get("frames") or []]
    print("\n".join(lines))
    return 0


def run_get(args: argparse.Namespace) -> int:
    client, target, _ = _open(args)
    sc = reader.find(client, target, args.id, args.host)
    core = sc.get("core") or {}
    workdir = args.output.absolute().parent if args.output else None
    if args.mini:
        write_output(args.output, lambda out: reader.fetch_mini(client, target, sc, output=out))
        print(f"wrote the mini core of {sc['id']} from {sc['host']} to {args.output or 'stdout'}", file=sys.stderr)
        return 0

    def write(out) -> None:
        # One bar over both steps: the download, then the decompression.
        with Progress((core.get("bytes") or 0) + (core.get("raw_bytes") or 0), sc["id"]) as progress:
            reader.fetch_core(client, target, sc, output=out, progress=progress, workdir=workdir)

    write_output(args.output, write)
    print(f"wrote {display(sc['id'])} from {display(sc['host'])} ({human_size(core.get('raw_bytes') or 0)}) to "
          f"{args.output or 'stdout'}", file=sys.stderr)
    return 0
