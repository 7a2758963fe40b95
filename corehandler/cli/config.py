"""config check, config show."""

from __future__ import annotations

import argparse

from corehandler.cli.common import base_paths, emit, load
from corehandler.config import config_files
from corehandler.configtext import config_json, render_toml
from corehandler.host import handler
from corehandler.paths import Host


def register(commands) -> None:
    parser = commands.add("config", None, help="check or show the configuration")
    verbs = parser.add_subparsers(dest="config_command", metavar="check|show", required=True)
    verbs.add_parser("check", parents=[commands.common()], help="validate strictly; name the bad file, key and "
                     "value").set_defaults(handler=run_check)
    show = verbs.add_parser("show", parents=[commands.common()], help="print the effective configuration")
    show.add_argument("--csplice", action="store_true", help="print the csplice.conf this config renders")
    show.set_defaults(handler=run_show)


def run_check(args: argparse.Namespace) -> int:
    files = [str(p) for p in config_files(base_paths(args))]
    load(args)  # raises ConfigError naming file, key and value
    emit(args, {"ok": True, "files": files},
         "config OK: " + (", ".join(files) if files else "no files, the defaults"))
    return 0


def run_show(args: argparse.Namespace) -> int:
    config, paths = load(args)
    if args.csplice:
        text = handler.settings_for(config.capture, paths, Host())
        emit(args, {"csplice_settings": text}, text.rstrip("\n"))
    else:
        emit(args, config_json(config), render_toml(config).rstrip("\n"))
    return 0
