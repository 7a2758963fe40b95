"""The MATCH arguments every verb that names dumps takes (list, info, dump, debug, and verbs to come), and the
dumps they select: add_match_options(parser) when registering, then `with open_dumps(args) as dumps:
select(args, dumps)`. The rule itself is corehandler/store/match.py's; this is its command line.

Root reads the index; a user who may not reads their own published view (corehandler/store/userview.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal as signals

from corehandler.cli import crashview
from corehandler.cli.common import load
from corehandler.errors import NoMatchError, UsageError
from corehandler.printable import display
from corehandler.store import match
from corehandler.store.dumprow import Dump
from corehandler.store.dumps import Dumps
from corehandler.store.index import Store
from corehandler.store.match import Filter
from corehandler.store.userview import UserView
from corehandler.units import UnitError, parse_duration

MATCH_HELP = ("PID, id (or a unique id prefix, as list prints it), /path/to/exe, or comm; pid=, id=, exe=, "
              "comm= say which, as do the journal's FIELD=value (COREDUMP_PID, COREDUMP_COMM, COREDUMP_EXE, "
              "COREDUMP_UID, COREDUMP_SIGNAL, COREDUMP_SIGNAL_NAME, COREDUMP_UNIT, COREDUMP_USER_UNIT, "
              "COREHANDLER_ID, COREHANDLER_SIGNATURE_ID, COREHANDLER_CONTAINER_ID, COREHANDLER_POD_NAME). "
              "Words of one kind are alternatives, different kinds must all hold")
# Journal fields of the analysis, matched by the filter options of the same meaning (crashview.py).
ANALYSIS_FIELDS = {"COREDUMP_UNIT": "unit", "COREDUMP_USER_UNIT": "unit", "COREHANDLER_SIGNATURE_ID": "signature",
                   "COREHANDLER_CONTAINER_ID": "container", "COREHANDLER_POD_NAME": "pod"}
TIME_HELP = ("@EPOCH, YYYY-MM-DD[ HH:MM[:SS]], now, today, yesterday, or a systemd.time(7) span before now "
             "(-2h, -7days, \"2 weeks ago\") or after it (+1h)")


# How a MATCH word may start when it says its kind: what shell completion offers (cli/argtree.py reads it).
MATCH_KEYS = tuple(f"{key}=" for key in (*match.KINDS, *match.JOURNAL_FIELDS, *ANALYSIS_FIELDS))


def add_match_options(p: argparse.ArgumentParser) -> None:
    words = p.add_argument("match", nargs="*", metavar="MATCH", help=MATCH_HELP)
    words.completions = MATCH_KEYS
    p.add_argument("-S", "--since", metavar="TIME", help=f"dumps at or after TIME: {TIME_HELP}")
    p.add_argument("-U", "--until", metavar="TIME", help="dumps at or before TIME")
    p.add_argument("--signal", metavar="SIG", help="only dumps caused by this signal (number or name)")
    p.add_argument("-1", dest="last", action="store_const", const=1, help="only the newest matching dump")
    p.add_argument("-n", dest="last", type=_count, metavar="N", help="only the newest N matching dumps")
    crashview.add_filter_options(p)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) > 2**63 - 1:  # SQLite's LIMIT is a 64-bit integer
        raise argparse.ArgumentTypeError(f"not a count: {text!r}")
    return int(text)


def parse_time(text: str, now: float | None = None) -> float:
    now = dt.datetime.now().timestamp() if now is None else now
    try:
        if text == "now":
            return now
        if text.startswith("@"):
            return float(text[1:])
        if text.startswith("-"):
            return now - parse_duration(text[1:])
        if text.endswith(" ago"):
            return now - parse_duration(text.removesuffix(" ago"))
        if text.startswith("+"):
            return now + parse_duration(text[1:])
        if text in ("today", "yesterday"):
            midnight = dt.datetime.combine(dt.date.today(), dt.time())
            return (midnight - dt.timedelta(days=text == "yesterday")).timestamp()
        return dt.datetime.fromisoformat(text).timestamp()  # naive means local time, as in coredumpctl
    except (ValueError, UnitError) as e:
        raise UsageError(f"cannot parse time {text!r}: use {TIME_HELP}") from e


def parse_signal(text: str) -> int:
    if text.isdigit():
        if int(text) > match.MAX_C_INT:
            raise UsageError(f"unknown signal {text!r}")
        return int(text)
    name = text.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        return int(signals.Signals[name])
    except KeyError:
        raise UsageError(f"unknown signal {text!r}") from None


def _analysis_fields(args: argparse.Namespace) -> list[str]:
    """The MATCH words without the analysis's journal fields, which set the filter options instead."""
    words = []
    for word in args.match:
        key, sep, value = word.partition("=")
        option = ANALYSIS_FIELDS.get(key) if sep else None
        if option is None:
            words.append(word)
        elif getattr(args, option, None) not in (None, value):
            raise UsageError(f"{key}={value} and --{option} {getattr(args, option)} cannot both hold")
        else:
            setattr(args, option, value)
    return words


def build_filter(args: argparse.Namespace) -> Filter:
    words = _analysis_fields(args)  # before crashview.filtering reads the options they set
    return match.build(words,
                       since=parse_time(args.since) if args.since else None,
                       until=parse_time(args.until) if args.until else None,
                       signal=parse_signal(args.signal) if args.signal else None,
                       # -n applies after the analysis filters, in select
                       last=None if crashview.filtering(args) else getattr(args, "last", None))


def open_dumps(args: argparse.Namespace) -> Dumps:
    """The index, read-only, when this user may read it (root); else the user's own view."""
    _, paths = load(args)
    index = paths.index_path
    if os.geteuid() != 0 and not os.access(index, os.R_OK):
        return UserView(paths.state_dir, os.getuid())
    if not index.exists():
        raise NoMatchError(f"no dumps: there is no index in {paths.state_dir}")
    return Store(paths.state_dir, readonly=True)


def select(args: argparse.Namespace, dumps: Dumps) -> list[Dump]:
    found = dumps.query(build_filter(args))
    if crashview.filtering(args):
        found = crashview.apply_filters(args, dumps, found, getattr(args, "last", None))
    if not found:
        # A user's view holds only what is theirs to see: the rest is not there for them, not "denied", so an
        # id is never confirmed to someone who may not see it (docs/design.md, "Users").
        mine = " of yours (other users' dumps and setuid programs' are root's)" if isinstance(dumps, UserView) \
            else ""
        raise NoMatchError("no dumps" + mine + " match"
                           + (f" {' '.join(map(display, args.match))}" if args.match else ""))
    return found
