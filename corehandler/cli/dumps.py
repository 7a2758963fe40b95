"""list, info, dump, debug, vacuum: the stored dumps, in the habits of coredumpctl.

A MATCH selects dumps: a number is a PID, a path (with '/') an executable, `id=PREFIX` an id, anything else
a comm; `pid=`, `exe=`, `comm=` say it explicitly. Several matches of one kind are alternatives; different
kinds must all hold.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import shlex
import shutil
import signal as signals
import subprocess
import sys
import tempfile
from pathlib import Path

from corehandler import compress, retention, spool
from corehandler.cli import crashview
from corehandler.cli.common import emit, load
from corehandler.errors import CorehandlerError, NoMatchError, SystemFailure, UsageError
from corehandler.store import Dump, Filter, Store
from corehandler.units import UnitError, human_size, parse_duration


def register(commands) -> None:
    p = commands.add("list", run_list, help="list stored dumps (the default verb)")
    _match_options(p)
    p.add_argument("-1", dest="last", action="store_const", const=1, help="only the newest matching dump")
    p.add_argument("-n", dest="last", type=_count, metavar="N", help="only the newest N matching dumps")
    crashview.add_list_options(p)

    p = commands.add("info", run_info, help="everything known about matching dumps")
    _match_options(p)
    p.add_argument("--no-verify", action="store_true", help="skip decompressing the stored file to check it")
    crashview.add_info_options(p)

    p = commands.add("dump", run_dump, help="write the newest matching core, byte-identical to the capture")
    _match_options(p)
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here (default: stdout, if not a "
                   "terminal)")

    p = commands.add("debug", run_debug, help="open a debugger on the newest matching core and its executable")
    _match_options(p)
    p.add_argument("--debugger", default=None, metavar="PROGRAM",
                   help="the debugger (default $COREHANDLER_DEBUGGER or gdb)")
    p.add_argument("-A", "--debugger-arguments", default="", metavar="ARGS",
                   help="extra arguments for the debugger, one shell-quoted string")

    p = commands.add("vacuum", run_vacuum, help="apply the retention policy now")
    p.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")


def _count(text: str) -> int:
    if not text.isdigit() or int(text) > 2**63 - 1:  # SQLite's LIMIT is a 64-bit integer
        raise argparse.ArgumentTypeError(f"not a count: {text!r}")
    return int(text)


def _match_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("match", nargs="*", metavar="MATCH", help="PID, /path/to/exe, comm, or id=PREFIX")
    p.add_argument("-S", "--since", metavar="TIME", help="dumps at or after TIME (@EPOCH, ISO date/time, "
                   "or -DURATION ago, e.g. -2h)")
    p.add_argument("-U", "--until", metavar="TIME", help="dumps at or before TIME")
    p.add_argument("--signal", metavar="SIG", help="only dumps caused by this signal (number or name)")
    crashview.add_filter_options(p)


# -- selection ------------------------------------------------------------------------------------------------

def parse_time(text: str, now: float | None = None) -> float:
    now = dt.datetime.now().timestamp() if now is None else now
    try:
        if text == "now":
            return now
        if text.startswith("@"):
            return float(text[1:])
        if text.startswith("-"):
            return now - parse_duration(text[1:])
        if text in ("today", "yesterday"):
            midnight = dt.datetime.combine(dt.date.today(), dt.time())
            return (midnight - dt.timedelta(days=text == "yesterday")).timestamp()
        return dt.datetime.fromisoformat(text).timestamp()  # naive means local time, as in coredumpctl
    except (ValueError, UnitError) as e:
        raise UsageError(f"cannot parse time {text!r}: use @EPOCH, YYYY-MM-DD[ HH:MM[:SS]] or -DURATION") from e


# pid_t and the kernel's signal numbers are C ints; a larger number matches nothing and SQLite cannot take it.
_MAX_C_INT = 2**31 - 1


def parse_signal(text: str) -> int:
    if text.isdigit():
        if int(text) > _MAX_C_INT:
            raise UsageError(f"unknown signal {text!r}")
        return int(text)
    name = text.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return int(signals.Signals[name])
    except KeyError:
        raise UsageError(f"unknown signal {text!r}") from None


def signal_name(number: int | None) -> str:
    """The name as coredumpctl lists it (SEGV for 11); "-" when the record has none."""
    name = spool.signal_name(number)
    return "-" if name is None else name.removeprefix("SIG")


def build_filter(args: argparse.Namespace) -> Filter:
    kinds: dict[str, list] = {"ids": [], "pids": [], "comms": [], "exes": []}
    for m in args.match:
        key, sep, value = m.partition("=")
        if sep and key in ("id", "pid", "comm", "exe"):
            kind = key + "s"
        elif m.isdigit():
            kind, value = "pids", m
        elif "/" in m:
            kind, value = "exes", m
        else:
            kind, value = "comms", m
        if kind == "pids":
            if not value.isdigit() or int(value) > _MAX_C_INT:
                raise UsageError(f"not a PID: {value!r}")
            value = int(value)
        kinds[kind].append(value)
    return Filter(ids=tuple(kinds["ids"]), pids=tuple(kinds["pids"]), comms=tuple(kinds["comms"]),
                  exes=tuple(kinds["exes"]),
                  since=parse_time(args.since) if args.since else None,
                  until=parse_time(args.until) if args.until else None,
                  signal=parse_signal(args.signal) if args.signal else None,
                  last=None if crashview.filtering(args) else getattr(args, "last", None))


def _open_store(args: argparse.Namespace, readonly: bool = True) -> Store:
    _, paths = load(args)
    if readonly and not (paths.state_dir / "index.sqlite").exists():
        raise NoMatchError(f"no dumps: there is no index in {paths.state_dir}")
    return Store(paths.state_dir, readonly=readonly)


def select(args: argparse.Namespace, store: Store) -> list[Dump]:
    dumps = crashview.apply_filters(args, store, store.query(build_filter(args)), getattr(args, "last", None))
    if not dumps:
        raise NoMatchError("no dumps match" + (f" {' '.join(args.match)}" if args.match else ""))
    return dumps


# -- the stored file's state ----------------------------------------------------------------------------------

def file_state(store: Store, d: Dump, verify: bool) -> tuple[str, str | None]:
    """("present"|"missing"|"corrupt"|"none", problem). Without verify only the size and the zstd frame
    header are checked (cheap enough for list); with it the file is decompressed and hashed."""
    path = store.file_path(d)
    if path is None:
        return "none", None
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "missing", f"{path} is missing"
    try:
        if verify:
            compress.verify(path, d.raw_bytes, d.sha256)
        else:
            compress.check_header(path, d.raw_bytes)
            if size != d.stored_bytes:
                raise compress.VerifyError(f"{path.name} is {size} bytes, {d.stored_bytes} were stored")
    except compress.VerifyError as e:
        return "corrupt", e.message
    except FileNotFoundError:  # retention removed it after the stat
        return "missing", f"{path} is missing"
    except OSError as e:
        return "corrupt", f"{path.name}: {e.strerror}"
    return "present", None


# -- list ------------------------------------------------------------------------------------------------------

def _cgroup(text: str | None) -> str | None:
    """The process's cgroup as coredumpctl shows it: the unified hierarchy's path ("0::/path"), else the
    first v1 hierarchy's; /proc/PID/cgroup lists one line per hierarchy."""
    lines = [line.split(":", 2) for line in (text or "").splitlines() if line.count(":") >= 2]
    for hierarchy, _, path in lines:
        if hierarchy == "0":
            return path
    return lines[0][2] if lines else None


def _time(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def run_list(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        dumps = select(args, store)
        rows = []
        for d in dumps:
            state, problem = file_state(store, d, verify=False)
            rows.append((d, state, problem))
        signatures = crashview.signatures(store, dumps)
    if args.group:
        groups = crashview.groups(dumps, signatures)
        emit(args, groups, crashview.group_table(groups))
        return 0
    if args.json:
        emit(args, [dict(d.summary(), record=None, corefile=state, corefile_problem=problem,
                         **crashview.list_json(signatures.get(d.id))) for d, state, problem in rows], "")
        return 0
    table = [("TIME", "PID", "UID", "SIG", "STATUS", "COREFILE", "SIZE", "SIGNATURE", "EXE")]
    for d, state, _ in rows:
        table.append((_time(d.crashed_at), str(d.pid if d.pid is not None else "-"),
                      str(d.uid if d.uid is not None else "-"), signal_name(d.signal), d.status, state,
                      human_size(d.raw_bytes) if d.path else "-", crashview.signature_cell(signatures.get(d.id)),
                      d.exe or d.comm or "-"))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]) - 1)]
    print("\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in table))
    return 0


# -- info ------------------------------------------------------------------------------------------------------

def _info_lines(store: Store, d: Dump, state: str, problem: str | None, all_threads: bool = False) -> list[str]:
    r = d.record
    proc = r.get("proc") or {}
    capture = r.get("capture") or {}
    fields = [
        ("ID", d.id),
        ("PID", f"{d.pid} ({d.comm})" if d.comm else str(d.pid)),
        ("UID", str(d.uid)), ("GID", str(d.gid)),
        ("Signal", f"{d.signal} ({signal_name(d.signal)})" if d.signal is not None else "-"),
        ("Timestamp", _time(d.crashed_at)),
        ("Command Line", " ".join(shlex.quote(a) for a in d.cmdline) if d.cmdline else None),
        ("Executable", d.exe),
        ("Control Group", _cgroup(proc.get("cgroup"))),
        ("Hostname", d.hostname), ("Boot ID", d.boot_id),
        ("Status", d.status), ("Problem", d.problem),
        ("Capture", f"{capture.get('strategy')}, {human_size(capture.get('bytes') or 0)} in "
                    f"{(capture.get('ns') or 0) / 1e6:.1f} ms" if capture.get("strategy") else None),
        ("Ingested", _time(d.ingested_at)),
    ]
    path = store.file_path(d)
    if path is None:
        fields.append(("Storage", "none (metadata only)"))
    else:
        kind = "compressed" if path.name.endswith(compress.COMPRESSED_SUFFIX) else "uncompressed"
        fields.append(("Storage", f"{path} ({kind}, {human_size(d.stored_bytes)} of {human_size(d.raw_bytes)})"))
        fields.append(("Core File", state + (f": {problem}" if problem else "")))
    errors = r.get("errors") or []
    for e in errors:
        fields.append(("Error", e))
    result = crashview.result(store, d)
    fields += crashview.info_fields(result)
    width = max(len(k) for k, _ in fields)
    trace = crashview.trace_lines(result, all_threads) if result else []
    return [f"{k.rjust(width)}: {v}" for k, v in fields if v is not None] + \
        ([""] + [" " * (width + 2) + line if line else "" for line in trace] if trace else [])


def run_info(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        dumps = select(args, store)
        out = []
        for d in dumps:
            state, problem = file_state(store, d, verify=not args.no_verify)
            out.append((d, state, problem, _info_lines(store, d, state, problem, args.all_threads),
                        crashview.info_json(store, d)))
    emit(args, [dict(d.summary(), corefile=state, corefile_problem=problem, **analysed)
                for d, state, problem, _, analysed in out],
         "\n\n".join("\n".join(lines) for *_, lines, _ in out))
    return 0


# -- dump, debug -----------------------------------------------------------------------------------------------

def _newest_with_core(store: Store, args: argparse.Namespace) -> tuple[Dump, Path]:
    dumps = select(args, store)
    for d in reversed(dumps):
        path = store.file_path(d)
        if path is not None:
            if not path.exists():
                raise CorehandlerError(f"the stored core of {d.id} is missing: {path}")
            return d, path
    raise NoMatchError(f"{dumps[-1].id} has no stored core ({dumps[-1].status})")


def _write_verified(d: Dump, path: Path, out) -> None:
    size, digest = compress.decompress_to(path, out)
    if size != d.raw_bytes or (d.sha256 and digest != d.sha256):
        raise compress.VerifyError(f"{path.name} decompressed to {size} bytes with sha256 {digest}, expected "
                                   f"{d.raw_bytes} bytes with {d.sha256}")


def run_dump(args: argparse.Namespace) -> int:
    if args.output is None and sys.stdout.isatty():
        raise UsageError("refusing to write a core to a terminal: use -o FILE or a pipe")
    with _open_store(args) as store:
        d, path = _newest_with_core(store, args)
        if args.output is None:
            sys.stdout.flush()
            with os.fdopen(os.dup(sys.stdout.fileno()), "wb") as out:
                _write_verified(d, path, out)
        else:
            # A temp file renamed into place: a corrupt store file never leaves a complete-looking output.
            target = args.output.absolute()
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
                try:
                    with os.fdopen(fd, "wb") as out:
                        _write_verified(d, path, out)
                    os.rename(tmp, target)
                except BaseException:
                    os.unlink(tmp)
                    raise
            except OSError as e:
                if e.filename == str(path):  # the store's file, not ours: vanished under a retention run
                    raise
                raise SystemFailure(f"cannot write {target}: {e.strerror}") from None
    print(f"wrote {d.id} ({human_size(d.raw_bytes)}) to {args.output or 'stdout'}", file=sys.stderr)
    return 0


def debugger_command(debugger: str, extra: list[str], exe: str | None, core: Path) -> list[str]:
    if Path(debugger).name.startswith("lldb"):
        return [debugger, *extra, "--core", str(core), *([exe] if exe else [])]
    if exe:
        return [debugger, *extra, exe, str(core)]
    return [debugger, *extra, "--core", str(core)]


def run_debug(args: argparse.Namespace) -> int:
    debugger = args.debugger or os.environ.get("COREHANDLER_DEBUGGER") or "gdb"
    if not shutil.which(debugger):
        raise CorehandlerError(f"debugger {debugger!r} not found")
    try:
        extra = shlex.split(args.debugger_arguments)
    except ValueError as e:
        raise UsageError(f"cannot parse -A {args.debugger_arguments!r}: {e}") from None
    with _open_store(args) as store:
        d, path = _newest_with_core(store, args)
        exe = (d.record.get("proc") or {}).get("exe")
        if exe is not None and not os.path.exists(exe):
            print(f"corehandler: {d.exe} is gone; debugging the core alone", file=sys.stderr)
            exe = None
        # The core holds the crashed process's secrets: a private directory, removed afterwards.
        with tempfile.TemporaryDirectory(prefix="corehandler-debug-") as tmp:
            core = Path(tmp) / f"{d.id}.core"
            with open(os.open(core, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                _write_verified(d, path, out)
            cmd = debugger_command(debugger, extra, exe, core)
            # The debugger owns the terminal; Ctrl-C is for it, not for us.
            previous = signals.signal(signals.SIGINT, signals.SIG_IGN)
            try:
                return subprocess.run(cmd).returncode
            finally:
                signals.signal(signals.SIGINT, previous)


# -- vacuum ----------------------------------------------------------------------------------------------------

def run_vacuum(args: argparse.Namespace) -> int:
    config, paths = load(args)
    with Store(paths.state_dir) as store:
        total, _ = retention.filesystem(store.store_dir)
        policy = retention.policy_from_config(config.retention, total)
        done = retention.vacuum(store, policy, dry_run=args.dry_run)
        size, count = store.totals()
    verb = "would delete" if args.dry_run else "deleted"
    lines = [f"{verb} {x.id} ({x.exe or '-'}, {human_size(x.freed_bytes)}): {x.rule}" for x in done]
    lines.append(f"{verb} {len(done)} dumps, {human_size(sum(x.freed_bytes for x in done))}; "
                 f"{count} dumps, {human_size(size)} in the store")
    emit(args, {"dry_run": args.dry_run, "deleted": [dataclasses.asdict(x) for x in done], "store_dumps": count,
                "store_bytes": size}, "\n".join(lines))
    return 0
