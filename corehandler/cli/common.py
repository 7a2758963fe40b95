"""What every verb module shares: the registration object, the global options, loading the config and paths,
and printing a result (`--json` or the human text). Verb modules import this, never the package itself, so the
import graph stays a tree (corehandler.cli loads the verb modules)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Sequence

from corehandler.cli import pager
from corehandler.config import Config, load_config
from corehandler.errors import SystemFailure, UsageError
from corehandler.paths import DEFAULT_STATE_DIR, Paths

Handler = Callable[[argparse.Namespace], "int | None"]


class Commands:
    """What a verb module's register() receives."""

    def __init__(self, subparsers, common: argparse.ArgumentParser):
        self._subparsers = subparsers
        self._common = common
        self.names: list[str] = []

    def add(self, name: str, handler: Handler, *, help: str, **kwargs) -> argparse.ArgumentParser:
        parser = self._subparsers.add_parser(name, help=help, description=help, parents=[self._common], **kwargs)
        parser.set_defaults(handler=handler)
        self.names.append(name)
        return parser

    def common(self) -> argparse.ArgumentParser:
        """The global options as a parent parser, for a verb's own sub-verbs (`config check`)."""
        return self._common


def global_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config-dir", type=Path, metavar="DIR",
                        help="configuration directory (default /etc/corehandler)")
    parser.add_argument("--state-dir", type=Path, metavar="DIR",
                        help="state directory, overriding state_dir in the config (default /var/lib/corehandler); "
                             "another than the default is another installation, with the supervised daemon's pid "
                             "files and log in DIR/run and DIR/log, so it never stops or answers for the host's")
    # --json alone is --json=pretty; cli.main rewrites --json=MODE (coredumpctl's spelling) into --json-mode
    # (coredumpctl_argv).
    parser.add_argument("--json", action="store_const", const="pretty",
                        help="print results as JSON (--json=short: one line, --json=pretty: indented, "
                             "--json=off: the human text)")
    parser.add_argument("--json-mode", dest="json", choices=JSON_MODES, help=argparse.SUPPRESS)
    parser.add_argument("--no-pager", action="store_true", help="never pipe the output into a pager")
    parser.add_argument("--no-legend", action="store_true", help="print tables without their header line")
    parser.add_argument("-q", "--quiet", action="store_true", help="say nothing on stderr but errors")


JSON_MODES = ("short", "pretty", "off")


# Options whose value may start with '-' (`-S -7days`), which argparse would take for an option.
DASH_VALUES = ("-S", "--since", "-U", "--until")


def coredumpctl_argv(argv: list[str]) -> list[str]:
    """argv as coredumpctl users write it, spelled as the parser takes it: `--json=MODE` (an optional value
    would swallow the verb after it) and `-S -7days`."""
    out: list[str] = []
    args = iter(argv)
    for a in args:
        if a == "--":
            out += [a, *args]
        elif a.startswith("--json="):
            out.append(f"--json-mode={a.split('=', 1)[1]}")
        elif a in DASH_VALUES:
            value = next(args, None)
            out.append(a if value is None else f"{a}={value}" if a.startswith("--") else a + value)
        else:
            out.append(a)
    return out


def note(args: argparse.Namespace, text: str) -> None:
    """An informational line on stderr (not an error): what -q silences."""
    if not getattr(args, "quiet", False):
        print(text, file=sys.stderr)


def base_paths(args: argparse.Namespace) -> Paths:
    """Paths with the command line's overrides."""
    overrides = {}
    if args.config_dir is not None:
        overrides["config_dir"] = args.config_dir.absolute()
    if args.state_dir is not None:
        overrides["state_dir"] = state_dir = args.state_dir.absolute()
        if state_dir != DEFAULT_STATE_DIR:
            overrides.update(run_dir=state_dir / "run", log_dir=state_dir / "log")
    return Paths(**overrides)


def load(args: argparse.Namespace) -> tuple[Config, Paths]:
    """The config and the effective paths: --state-dir wins over state_dir in the config."""
    base = base_paths(args)
    config = load_config(base)
    return config, (base if args.state_dir is not None else config.paths(base))


def emit(args: argparse.Namespace, data, human: str) -> None:
    """The result as JSON under --json (one line with --json=short), else the human text; through the pager on
    a terminal for the verbs that show dumps (their parser's `pager` default: list, info)."""
    if args.json in ("pretty", "short"):
        text = json.dumps(data, indent=2 if args.json == "pretty" else None, default=str,
                          separators=None if args.json == "pretty" else (",", ":"))
    else:
        text = human
    if text:
        pager.show(text, args.no_pager or not getattr(args, "pager", False))


def table(rows: list[tuple[str, ...]], legend: bool = True) -> str:
    """Rows as aligned columns, the first row the header (dropped when not legend: --no-legend, though it
    still sets the widths); the last column is not padded."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]
                     for r in (rows if legend else rows[1:]))


def terminal_width(args: argparse.Namespace) -> int | None:
    """How wide a table may be, as systemd's tools decide: unlimited with --full or into a pipe or file (a
    script reads whole lines), else $COLUMNS when it holds a number, else the terminal's width."""
    if getattr(args, "full", False) or not sys.stdout.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns or None
    except OSError:
        return None


ELLIPSIS = "…"
MIN_LAST = 20  # the last column (a name) is shortened down to this before another column is dropped


def fit(rows: list[tuple[str, ...]], width: int | None, drop: Sequence[str] = ()) -> list[tuple[str, ...]]:
    """The table's rows within width: the columns named in drop are dropped in that order while the last
    column would get fewer than MIN_LAST characters, then the last column is shortened at its start (a path's
    end names the program) and, at the very end, lines are cut. None: the rows as they are."""
    if width is None:
        return rows
    header = rows[0]
    keep = list(range(len(header)))

    def room() -> int:
        fixed = [max(len(r[i]) for r in rows) for i in keep[:-1]]
        return width - sum(fixed) - 2 * len(fixed)

    for name in drop:
        if room() >= MIN_LAST or name not in header:
            break
        keep.remove(header.index(name))
    last = max(room(), len(ELLIPSIS) + 1)

    def shorten(text: str) -> str:
        return text if len(text) <= last else ELLIPSIS + text[len(text) - last + len(ELLIPSIS):]
    return [tuple(r[i] for i in keep[:-1]) + (shorten(r[keep[-1]]),) for r in rows]


def cut(text: str, width: int | None) -> str:
    """Lines no wider than width: what fit could not narrow enough (a terminal narrower than the fixed
    columns)."""
    if width is None:
        return text
    return "\n".join(line if len(line) <= width else line[:width - 1] + ELLIPSIS for line in text.splitlines())


def write_output(output: Path | None, write: Callable[[BinaryIO], None], *, source: str | None = None) -> None:
    """Runs write(out) into output, or into stdout when output is None (refused on a terminal). A file goes
    through a temp name renamed into place, so a failed or corrupt copy never leaves a complete-looking one.
    An OSError on `source` (what is read, not ours) passes through; one on the output is a SystemFailure."""
    if output is None:
        if sys.stdout.isatty():
            raise UsageError("refusing to write a core to a terminal: use -o FILE or a pipe")
        sys.stdout.flush()
        with os.fdopen(os.dup(sys.stdout.fileno()), "wb") as out:
            write(out)
        return
    target = output.absolute()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                write(out)
            os.rename(tmp, target)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        if source is not None and e.filename == source:
            raise
        raise SystemFailure(f"cannot write {target}: {e.strerror}") from None
