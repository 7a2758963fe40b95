"""migrate: brings the index an older corehandler wrote to this version's schema, after a backup, as the daemon
does when it starts; `--check` only says whether a corehandler (this one, or one of --schema N) can use the
index, for the package's maintainer scripts to refuse a downgrade before it happens."""

from __future__ import annotations

import argparse
import os

from corehandler import __version__, daemonlock
from corehandler.cli.common import emit, load
from corehandler.errors import CorehandlerError, HandlerConflictError, NotRootError, UsageError
from corehandler.store import index


def register(commands) -> None:
    parser = commands.add("migrate", run_migrate, help="migrate the index an older corehandler wrote (after a "
                          "backup), as the daemon does at start; --check only says whether it can be used")
    parser.add_argument("--check", action="store_true",
                        help="change nothing: exit 0 when this corehandler (or one of --schema) can use the index, "
                        "directly or by migrating it; exit 7 when a newer one wrote it (a downgrade)")
    parser.add_argument("--schema", type=int, metavar="N",
                        help="with --check: ask for a corehandler that reads index schema N (a package's preinst "
                        f"passes its own; this one reads {index.SCHEMA_VERSION})")


def _facts(state_dir, found: index.IndexVersion | None) -> dict:
    return {"index": str(state_dir / "index.sqlite"), "index_schema": found and found.schema,
            "index_version": found and found.version, "schema": index.SCHEMA_VERSION, "version": __version__}


def run_migrate(args: argparse.Namespace) -> int:
    _, paths = load(args)
    if args.schema is not None and not args.check:
        raise UsageError("--schema only goes with --check")
    if args.check:
        return _check(args, paths)
    if os.geteuid() != 0:
        raise NotRootError("migrate writes the index and needs root")
    found = index.read_version(paths.state_dir)
    if found is None:
        emit(args, _facts(paths.state_dir, None), f"no index in {paths.state_dir}: nothing to migrate")
        return 0
    # The daemon migrates at start and holds its lock while it runs: a migration under a running daemon of
    # another version would change the schema under its feet.
    try:
        lock = daemonlock.hold(paths.daemon_lock)
    except CorehandlerError as e:  # names the daemon that holds it
        raise HandlerConflictError(f"{e.message}: it migrates the index when it starts; restart it instead") \
            from None
    try:
        with index.Store(paths.state_dir, migrate=True) as store:
            done = store.migration
    finally:
        os.close(lock)
    text = done.describe() if done else f"{paths.index_path} is already at schema {index.SCHEMA_VERSION}"
    emit(args, dict(_facts(paths.state_dir, found), migrated=done is not None,
                    backup=str(done.backup) if done else None), text)
    return 0


def _check(args: argparse.Namespace, paths) -> int:
    found = index.read_version(paths.state_dir)
    schema = index.SCHEMA_VERSION if args.schema is None else args.schema
    facts = _facts(paths.state_dir, found)
    if found is None:
        emit(args, dict(facts, usable=True), f"no index in {paths.state_dir}: any version may start here")
        return 0
    refused = index.refusal(paths.state_dir, found, schema)
    if refused is not None:
        raise refused
    if found.schema < index.SCHEMA_VERSION and args.schema is None:
        text = (f"{paths.index_path} is at {found.describe()}: the daemon of corehandler {__version__} migrates it "
                f"to schema {index.SCHEMA_VERSION} when it starts, after a backup")
    else:
        text = f"{paths.index_path} is at {found.describe()}: a corehandler of schema {schema} can use it"
    emit(args, dict(facts, usable=True), text)
    return 0
