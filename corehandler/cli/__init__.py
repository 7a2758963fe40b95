"""The corehandler command line: `corehandler [--config-dir DIR] [--state-dir DIR] [--json] VERB ...`.

Verbs live in modules, one per verb group, imported here and listed in COMMAND_MODULES; what they share is in
cli/common.py, which they import (never this package, which imports them). The registration convention:

    def register(commands: Commands) -> None:
        parser = commands.add("status", run_status, help="one line for --help")
        parser.add_argument(...)

    def run_status(args: argparse.Namespace) -> int | None:   # None means 0
        config, paths = load(args)
        ...

`commands.add` returns the verb's ArgumentParser, already given the global options (so they work before
or after the verb). A handler reports failure by raising a CorehandlerError (corehandler.errors): main()
prints `corehandler: <message>` on stderr, one line, and exits with the error's code. argparse's own usage
errors exit 2. `common.emit` prints a result as JSON under --json (coredumpctl's --json=short|pretty|off too),
else as the human text, through a pager on a terminal (cli/pager.py). With no verb, the verb
named DEFAULT_COMMAND runs if a module registered it (as coredumpctl lists by default).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys

from corehandler import __version__
from corehandler.cli import agent, analyze, config, doctor, dumps, fleet, install, migrate, serve, why
from corehandler.cli.common import Commands, coredumpctl_argv, global_options
from corehandler.errors import EXIT_PERMISSION, EXIT_SYSTEM, EXIT_USAGE, CorehandlerError

COMMAND_MODULES = (install, config, dumps, analyze, serve, migrate, doctor, why, fleet, agent)
DEFAULT_COMMAND = "list"


def build_parser() -> tuple[argparse.ArgumentParser, list[str]]:
    parser = argparse.ArgumentParser(prog="corehandler", description="Linux core-dump service: capture, "
                                     "store and inspect crashes.")
    parser.add_argument("--version", action="version", version=f"corehandler {__version__}")
    global_options(parser)
    # The same options after the verb; SUPPRESS keeps a verb's parser from resetting what came before it.
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    global_options(common)
    subparsers = parser.add_subparsers(dest="command", metavar="VERB")
    commands = Commands(subparsers, common)
    for module in COMMAND_MODULES:
        module.register(commands)
    return parser, commands.names


def main(argv: list[str] | None = None) -> int:
    parser, names = build_parser()
    argv = coredumpctl_argv(sys.argv[1:] if argv is None else list(argv))
    args = parser.parse_args(argv)
    if args.command is None:
        if DEFAULT_COMMAND not in names:
            parser.print_usage(sys.stderr)
            print("corehandler: a verb is required", file=sys.stderr)
            return EXIT_USAGE
        args = parser.parse_args(argv + [DEFAULT_COMMAND])
    if args.json == "off":
        args.json = None
    try:
        return args.handler(args) or 0
    except CorehandlerError as e:
        return _fail(e.message, e.exit_code)
    except BrokenPipeError:
        # `corehandler list | head`: the reader left; say nothing more.
        sys.stderr.close()
        return 141
    # The last resort for a failure no handler foresaw (a file that vanished under us, a full disk, an index
    # damaged past its header): still one line, not a traceback.
    except PermissionError as e:  # a file only root may read, met where no verb foresaw it
        return _fail(f"{e.filename}: permission denied" if e.filename else "permission denied", EXIT_PERMISSION)
    except OSError as e:
        return _fail(f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e), EXIT_SYSTEM)
    except sqlite3.Error as e:
        return _fail(f"the index is damaged or unreadable: {e}", EXIT_SYSTEM)
    except KeyboardInterrupt:
        return 130


def _fail(message: str, code: int) -> int:
    print(f"corehandler: {message}", file=sys.stderr)
    return code
