"""list, info, dump, debug, vacuum: the stored dumps, in the habits of coredumpctl.

Which dumps a MATCH names is one rule for every verb (corehandler/store/match.py, its options cli/selection.py):
a PID, an id or a unique id prefix, an executable path or a comm. Process-chosen names are printed escaped
(printable.py) and searched as their real bytes. As root the verbs read the index; as another user, the
user's own published dumps (userview.py).
"""

from __future__ import annotations

import argparse
import collections
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

from corehandler import fields, nocore
from corehandler.cli import crashview
from corehandler.cli.common import cut, emit, fit, load, note, terminal_width, write_output
from corehandler.cli.common import table as format_table
from corehandler.cli.progress import Progress
from corehandler.cli.selection import add_match_options, open_dumps, select
from corehandler.errors import EXIT_CONFLICT, CorehandlerError, NoMatchError, NotReadyError, NotRootError, UsageError
from corehandler.printable import display
from corehandler.store import compress, retention, userview
from corehandler.store.dumprow import COMPRESSING, Dump
from corehandler.store.dumps import Dumps
from corehandler.store.index import Store, blocks
from corehandler.units import human_size


def register(commands) -> None:
    p = commands.add("list", run_list, help="list stored dumps (the default verb)")
    add_match_options(p)
    _add_reverse(p)
    crashview.add_list_options(p)
    p.add_argument("-l", "--full", action="store_true", help="every column at full width on a terminal too "
                   "(into a pipe or file the table is always whole)")
    p.set_defaults(pager=True)

    p = commands.add("info", run_info, help="everything known about matching dumps (without MATCH: the newest "
                     "dump); exits 6 if a stored file is corrupt")
    add_match_options(p)
    _add_reverse(p)
    p.set_defaults(pager=True)
    p.add_argument("--no-verify", action="store_true", help="skip decompressing the stored file to check it")
    crashview.add_info_options(p)

    p = commands.add("dump", run_dump, help="write the newest matching core, byte-identical to the capture, "
                     "once it has verified")
    add_match_options(p)
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here (default: stdout, if not a "
                   "terminal)")

    p = commands.add("debug", run_debug, help="open a debugger on the newest matching core and its executable",
                     aliases=["gdb"])
    add_match_options(p)
    p.add_argument("--debugger", default=None, metavar="PROGRAM",
                   help="the debugger (default $COREHANDLER_DEBUGGER, $SYSTEMD_DEBUGGER or gdb)")
    p.add_argument("-A", "--debugger-arguments", default="", metavar="ARGS",
                   help="extra arguments for the debugger, one shell-quoted string")

    p = commands.add("vacuum", run_vacuum, help="apply the retention policy now (root)")
    p.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")

    p = commands.add("delete", run_delete, help="delete exactly the matching dumps now: core, mini core and "
                     "index row (root; a MATCH or a filter is required)")
    add_match_options(p)
    p.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")


def _add_reverse(p) -> None:
    p.add_argument("-r", "--reverse", action="store_true", help="newest first")


def signal_name(number: int | None) -> str:
    """The name as coredumpctl lists it (SEGV for 11); "-" when the record has none."""
    name = fields.signal_name(number)
    return "-" if name is None else name.removeprefix("SIG")


# -- the stored file's state ----------------------------------------------------------------------------------


def file_state(dumps: Dumps, d: Dump, verify: bool) -> tuple[str, str | None]:
    """("present"|"mini"|"missing"|"corrupt"|"unreadable"|"none"|"compressing", problem). Without verify only
    the size and the zstd frame header are checked (cheap enough for list); with it the file is decompressed and
    hashed. Corruption found is marked in the index (as root), so every view and the daemon's errors counter see
    it; a dump marked before stays corrupt. "mini": retention took the full core, the mini core is left."""
    if d.status == COMPRESSING:
        return COMPRESSING, None
    path = dumps.file_path(d)
    if path is None:
        mini = dumps.mini_path(d)
        if mini is None:
            return "none", None
        return ("mini", None) if os.path.exists(mini) else ("missing", f"{mini} is missing")
    try:
        size = path.stat().st_size
        if verify:
            compress.verify(path, d.raw_bytes, d.sha256)
        else:
            compress.check_header(path, d.raw_bytes)
            if size != d.stored_bytes:
                raise compress.VerifyError(f"{path.name} is {size} bytes, {d.stored_bytes} were stored")
    except compress.VerifyError as e:
        return _corrupt(dumps, d, e.message)
    except FileNotFoundError:  # also: retention removed it after the stat
        return "missing", f"{path} is missing"
    except PermissionError:
        return "unreadable", f"{path.name}: permission denied"
    except OSError as e:
        return _corrupt(dumps, d, f"{path.name}: {e.strerror}")
    if d.corrupt is not None:
        if not (verify and dumps.clear_corrupt(d)):
            return "corrupt", d.corrupt
        if d.uid is not None:  # it passed a whole check again: the mark goes, from the user's view too
            userview.refresh(dumps, [d.uid])
    return "present", None


def _corrupt(dumps: Dumps, d: Dump, problem: str) -> tuple[str, str]:
    if dumps.mark_corrupt(d, problem) and d.uid is not None:
        userview.refresh(dumps, [d.uid])
    return "corrupt", d.corrupt or problem


def _status(d: Dump, state: str) -> str:
    """The dump's status as the views show it: a stored file that failed a check makes it "corrupt"."""
    return "corrupt" if state == "corrupt" else d.status


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


def _json(d: Dump, state: str, problem: str | None, **extra) -> dict:
    """A dump as --json prints it: every index column, names as the process's bytes (invalid UTF-8 as lone
    surrogates, which json.dumps writes as \\udcXX escapes: the spool record's convention), the status the
    text shows (corrupt once a check of the stored file failed), and the keys of `coredumpctl --json list` (time
    in µs, sig, size: the stored file's bytes) for scripts written for it."""
    return dict(d.summary(), status=_status(d, state), corefile=state, corefile_problem=problem,
                time=round(d.crashed_at * 1_000_000), sig=d.signal, size=d.stored_bytes if d.path else None, **extra)


def run_list(args: argparse.Namespace) -> int:
    with open_dumps(args) as dumps:
        found = _ordered(args, select(args, dumps))
        rows = [(d, *file_state(dumps, d, verify=False)) for d in found]
        signatures = crashview.signatures(dumps, found)
    if args.group:
        groups = crashview.groups(found, signatures)
        emit(args, groups, crashview.group_table(groups, not args.no_legend))
        return 0
    if args.json:
        emit(args, [_json(d, state, problem, record=None, no_core=nocore.explain(d.record),
                          **crashview.list_json(signatures.get(d.id)))
                    for d, state, problem in rows], "")
        return 0
    width = terminal_width(args)
    short = _short_ids([d.id for d in found]) if width is not None else {}
    table = [("TIME", "PID", "UID", "GID", "SIG", "STATUS", "COREFILE", "SIZE", "ID", "SIGNATURE", "EXE")]
    for d, state, _ in rows:
        table.append((_time(d.crashed_at), *(str(n if n is not None else "-") for n in (d.pid, d.uid, d.gid)),
                      signal_name(d.signal), _status(d, state), state, _disk_size(d, state), short.get(d.id, d.id),
                      crashview.signature_cell(signatures.get(d.id), d.record),
                      display(d.exe) if d.exe else f"({display(d.comm)})" if d.comm else "-"))
    emit(args, None, cut(format_table(fit(table, width, LIST_DROPS), not args.no_legend), width))
    return 0


# What a terminal too narrow for every column loses first; EXE, the last, is shortened instead (common.fit).
LIST_DROPS = ("GID", "STATUS", "SIGNATURE", "UID", "SIZE", "ID")


def _disk_size(d: Dump, state: str) -> str:
    """SIZE as coredumpctl shows it: what the dump takes on disk (`info` has the core's own size too)."""
    if state == "mini":
        return human_size(d.mini_bytes or 0)
    if d.status == COMPRESSING:
        return human_size(d.raw_bytes)  # the spool's copy, until the store's replaces it
    return human_size(d.stored_bytes) if d.path else "-"


def _short_ids(ids: list[str]) -> dict[str, str]:
    """On a terminal, each id by its microseconds alone where no other listed dump shares them: still a
    MATCH word every verb takes (an id prefix), a third of the width."""
    usecs = [i.split("-", 1)[0] for i in ids]
    seen = collections.Counter(usecs)
    return {i: u for i, u in zip(ids, usecs) if seen[u] == 1}


def _ordered(args: argparse.Namespace, found: list[Dump]) -> list[Dump]:
    """Oldest first, as coredumpctl lists; -r newest first."""
    return list(reversed(found)) if args.reverse else found


# -- info ------------------------------------------------------------------------------------------------------


def _capture_line(capture: dict) -> str | None:
    if not capture.get("strategy"):
        return None
    how = capture["strategy"]
    if isinstance(capture.get("direct_from"), int):
        how += f", O_DIRECT from {human_size(capture['direct_from'])}"
    return f"{how}, {human_size(capture.get('bytes') or 0)} in {(capture.get('ns') or 0) / 1e6:.1f} ms"

def _info_lines(dumps: Dumps, d: Dump, state: str, problem: str | None, all_threads: bool = False) -> list[str]:
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
        ("Status", _status(d, state)), ("Problem", d.problem),
        ("Capture", _capture_line(capture)),
        ("Ingested", _time(d.ingested_at)),
    ]
    path, mini = dumps.file_path(d), dumps.mini_path(d)
    if d.status == COMPRESSING:
        fields.append(("Storage", f"being compressed ({human_size(d.raw_bytes)}); `dump` and `debug` can "
                                  "read it once its status is final"))
    elif path is None:
        fields.append(("Storage", "none (metadata only)" if mini is None else "mini core only (retention "
                       "deleted the full core)"))
    else:
        kind = "compressed" if path.name.endswith(compress.COMPRESSED_SUFFIX) else "uncompressed"
        fields.append(("Storage", f"{path} ({kind}, {human_size(d.stored_bytes)} of {human_size(d.raw_bytes)})"))
    if mini is not None:
        fields.append(("Mini Core", f"{mini} ({human_size(d.mini_bytes or 0)}; stacks and registers: "
                       f"`debug` uses it {'once the full core is gone' if path else 'now'})"))
    if path is not None or mini is not None:
        fields.append(("Core File", state + (f": {problem}" if problem else "")))
    fields += crashview.nocore_fields(r)
    for e in r.get("errors") or []:
        fields.append(("Error", str(e)))
    result = crashview.result(dumps, d)
    fields += crashview.info_fields(result, full_core=path is not None)
    width = max(len(k) for k, _ in fields)
    trace = crashview.trace_lines(result, all_threads) if result else []
    # Every value through display: the process chose its comm, cmdline, exe, cgroup and hostname.
    return [f"{k.rjust(width)}: {display(v)}" for k, v in fields if v is not None] + \
        ([""] + [" " * (width + 2) + line if line else "" for line in trace] if trace else [])


def run_info(args: argparse.Namespace) -> int:
    if args.last is None and not (args.match or args.since or args.until or args.signal
                                  or crashview.filtering(args)):
        args.last = 1  # as coredumpctl: info alone is about the newest dump, not every dump
    with open_dumps(args) as dumps:
        out = []
        for d in _ordered(args, select(args, dumps)):
            state, problem = file_state(dumps, d, verify=not args.no_verify)
            out.append((d, state, problem, _info_lines(dumps, d, state, problem, args.all_threads),
                        crashview.info_json(dumps, d)))
    emit(args, [_json(d, state, problem, no_core=nocore.explain(d.record), **analysed)
                for d, state, problem, _, analysed in out],
         "\n\n".join("\n".join(lines) for *_, lines, _ in out))
    corrupt = [d.id for d, state, *_ in out if state == "corrupt"]
    if corrupt:
        raise compress.VerifyError(f"the stored file of {len(corrupt)} of {len(out)} dumps is corrupt: "
                                   + ", ".join(corrupt))
    return 0


# -- dump, debug -----------------------------------------------------------------------------------------------

def _newest_with_core(dumps: Dumps, args: argparse.Namespace, mini: bool = False) -> tuple[Dump, Path, bool]:
    """The newest matching dump with a stored core, its path and whether that is its mini core: the full core
    when it is there, else (with mini) the mini core retention left."""
    found = select(args, dumps)
    for d in reversed(found):
        if d.status == COMPRESSING:  # the newest match: not an older dump in its place
            raise NotReadyError(f"the core of {d.id} is still being compressed into the store: try again when "
                                "`corehandler list` shows its status final")
        path = dumps.file_path(d)
        if path is not None:
            if not path.exists():
                raise CorehandlerError(f"the stored core of {d.id} is missing: {path}")
            return d, path, False
        path = dumps.mini_path(d) if mini else None
        if path is not None:
            if not path.exists():
                raise CorehandlerError(f"the mini core of {d.id} is missing: {path}")
            return d, path, True
    last = found[-1]
    left = " (only its mini core is left: `debug` opens it)" if last.mini_path else ""
    raise NoMatchError(f"{last.id} has no stored core ({last.status}){left}")


def _write_verified(dumps: Dumps, d: Dump, path: Path, out, progress=None) -> None:
    """Writes the original bytes to out and checks them (size, sha256; zstd checks its frame checksum). The
    caller decides what a failure leaves: nothing it has not verified reaches a reader."""
    try:
        size, digest = compress.decompress_to(path, out, progress)
        if size != d.raw_bytes or (d.sha256 and digest != d.sha256):
            raise compress.VerifyError(f"{path.name} decompressed to {size} bytes with sha256 {digest}, "
                                       f"expected {d.raw_bytes} bytes with {d.sha256}")
    except compress.VerifyError as e:
        _corrupt(dumps, d, e.message)
        raise
    except PermissionError:
        raise NotRootError(f"cannot read the stored core of {d.id}: permission denied") from None


def run_dump(args: argparse.Namespace) -> int:
    if args.output is None and sys.stdout.isatty():
        raise UsageError("refusing to write a core to a terminal: use -o FILE or a pipe")
    with open_dumps(args) as dumps:
        d, path, _ = _newest_with_core(dumps, args)
        if args.output is None:
            # Stdout is a pipe or a file someone reads as it grows: the whole stored file is verified first
            # (one decompression to nowhere), so a corrupt one writes not a byte. A file -o goes through a
            # temp name renamed into place once verified (write_output).
            with open(os.devnull, "wb") as sink:
                _write_verified(dumps, d, path, sink)
        with Progress(d.raw_bytes, d.id, enabled=False if args.quiet else None) as progress:
            # A file that vanished under a retention run is the store's problem, not the output's.
            write_output(args.output, lambda out: _write_verified(dumps, d, path, out, progress), source=str(path))
    note(args, f"wrote {d.id} ({human_size(d.raw_bytes)}) to {args.output or 'stdout'}")
    return 0


def _copy_mini(path: Path, out, d: Dump) -> None:
    try:
        with open(path, "rb") as src:
            shutil.copyfileobj(src, out)
    except PermissionError:
        raise NotRootError(f"cannot read the mini core of {d.id}: permission denied") from None


def debugger_command(debugger: str, extra: list[str], exe: str | None, core: Path) -> list[str]:
    if Path(debugger).name.startswith("lldb"):
        return [debugger, *extra, "--core", str(core), *([exe] if exe else [])]
    if exe:
        return [debugger, *extra, exe, str(core)]
    return [debugger, *extra, "--core", str(core)]


def run_debug(args: argparse.Namespace) -> int:
    debugger = (args.debugger or os.environ.get("COREHANDLER_DEBUGGER") or os.environ.get("SYSTEMD_DEBUGGER")
                or "gdb")
    if not shutil.which(debugger):
        raise CorehandlerError(f"debugger {debugger!r} not found")
    try:
        extra = shlex.split(args.debugger_arguments)
    except ValueError as e:
        raise UsageError(f"cannot parse -A {args.debugger_arguments!r}: {e}") from None
    with open_dumps(args) as dumps:
        d, path, is_mini = _newest_with_core(dumps, args, mini=True)
        exe = d.exe
        if exe is not None and not os.path.exists(exe):
            note(args, f"corehandler: {display(exe)} is gone; debugging the core alone")
            exe = None
        # The core holds the crashed process's secrets: a private directory, removed afterwards.
        with tempfile.TemporaryDirectory(prefix="corehandler-debug-") as tmp:
            core = Path(tmp) / f"{d.id}.core"
            with open(os.open(core, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                if is_mini:
                    _copy_mini(path, out, d)
                else:
                    _write_verified(dumps, d, path, out)
            which = ("the mini core (the full core is gone: each thread's stack and registers, not the heap)"
                     if is_mini else "the full core")
            note(args, f"corehandler: debugging {d.id} from {which}")
            cmd = debugger_command(debugger, extra, exe, core)
            # The debugger owns the terminal; Ctrl-C is for it, not for us.
            previous = signals.signal(signals.SIGINT, signals.SIG_IGN)
            try:
                return subprocess.run(cmd).returncode
            finally:
                signals.signal(signals.SIGINT, previous)


# -- vacuum ----------------------------------------------------------------------------------------------------

def run_vacuum(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise NotRootError("vacuum deletes stored dumps and needs root")
    config, paths = load(args)
    with Store(paths.state_dir) as store:
        total, _ = retention.filesystem(store.store_dir)
        policy = retention.policy_from_config(config.retention, total)
        done = retention.vacuum(store, policy, dry_run=args.dry_run)
        if done and not args.dry_run:
            userview.refresh(store)
        size, count = store.totals()
    verb = "would delete" if args.dry_run else "deleted"
    lines = [f"{verb} {x.id}{' full core (its mini core stays)' if x.kept_mini else ''} ({display(x.exe) or '-'}, "
             f"{human_size(x.freed_bytes)}): {x.rule}" for x in done]
    lines.append(f"{verb} {len(done)} dumps, {human_size(sum(x.freed_bytes for x in done))}; "
                 f"{count} dumps, {human_size(size)} in the store")
    emit(args, {"dry_run": args.dry_run, "deleted": [dataclasses.asdict(x) for x in done], "store_dumps": count,
                "store_bytes": size}, "\n".join(lines))
    return 0


# -- delete ----------------------------------------------------------------------------------------------------

DELETE_RULE = "delete"  # the deletions' rule in the index and the metrics, beside retention's


def run_delete(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise NotRootError("delete removes stored dumps and needs root")
    if not (args.match or args.since or args.until or args.signal or args.last or crashview.filtering(args)):
        raise UsageError("delete needs a MATCH or a filter (--since, --signal, -n ...); `vacuum` applies the "
                         "retention policy to every dump")
    _, paths = load(args)
    with Store(paths.state_dir) as store:
        found = select(args, store)
        done, busy = [], []
        for d in found:
            if d.status == COMPRESSING:  # the daemon is writing its stored file: not ours to pull away
                busy.append(d)
                continue
            freed = blocks(store.file_path(d)) + blocks(store.mini_path(d)) if args.dry_run \
                else store.delete(d, DELETE_RULE)
            if freed is not None:  # None: retention or another delete took it first
                done.append((d, freed))
        if done and not args.dry_run:
            userview.refresh(store, {d.uid for d, _ in done if d.uid is not None})
    verb = "would delete" if args.dry_run else "deleted"
    lines = [f"{verb} {d.id} ({display(d.exe) or display(d.comm) or '-'}, {human_size(freed)})" for d, freed in done]
    lines += [f"kept {d.id}: its core is being compressed; delete it once `list` shows its status final"
              for d in busy]
    lines.append(f"{verb} {len(done)} of {len(found)} matching dumps, {human_size(sum(f for _, f in done))}")
    emit(args, {"dry_run": args.dry_run, "deleted": [{"id": d.id, "freed_bytes": f} for d, f in done],
                "kept_compressing": [d.id for d in busy]}, "\n".join(lines))
    return EXIT_CONFLICT if busy and not done else 0
