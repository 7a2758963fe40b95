"""Which stored dumps a MATCH names: one rule for every verb (list, info, dump, debug, and verbs to come), on
the index as root and on a user's published view alike.

A MATCH word, as coredumpctl reads one:
  digits (a number up to 2^31-1)      a PID
  an id, or a unique prefix of one    the dump with that id (what `list` prints in its ID column):
                                      `<µs>-<boot id>-<pid>`, a prefix of at least its 11 first digits
  a word with '/'                     an executable path, or a comm (a comm may hold '/': `a/b` is the
                                      path ./a/b or the comm a/b; `exe=` or `comm=` say which)
  anything else                       a comm
  `pid=`, `comm=`, `exe=`, `id=`      say the kind explicitly
  `FIELD=value`, FIELD a journal      as coredumpctl takes them: COREDUMP_PID, COREDUMP_COMM, COREDUMP_EXE,
  field name                          COREHANDLER_ID, COREDUMP_UID, COREDUMP_SIGNAL, COREDUMP_SIGNAL_NAME here;
                                      the analysis's fields (COREDUMP_UNIT ...) in cli/selection.py
  any other word with '=' (and no    refused, as coredumpctl takes every such word for a journal match: never a
  '/' before it: that is a path)      comm (`comm=a=b` names one). A trusted field (_COMM=, _PID=) is refused with
                                      the COREDUMP_ field meant: in a crash's entry it names the process that
                                      logged it, not the one that crashed
Several words of one kind are alternatives; words of different kinds, and --since/--until/--signal, must all
hold (one uid and one signal at most). An id prefix that names more than one dump is refused (as git refuses
an ambiguous hash).

Names are compared as the process's bytes: strings here are what Python makes of them with surrogateescape
(argv, and the spool record's lone-surrogate convention), so a name that is not UTF-8 matches itself and
nothing else. A comm matches the /proc comm or the kernel's %e form (which shows '/' as '!').
"""

from __future__ import annotations

import os
import re
import signal as signals
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from corehandler import fields, spool
from corehandler.errors import UsageError

if TYPE_CHECKING:
    from corehandler.store.dumprow import Dump

# pid_t and the kernel's signal numbers are C ints; a larger number is no PID.
MAX_C_INT = 2**31 - 1
KINDS = ("id", "pid", "comm", "exe")  # the explicit `KIND=` forms
# The journal's names (the fields of a dump's entry, observe/journal.py) of what a Filter compares.
JOURNAL_FIELDS = {"COREDUMP_PID": "pid", "COREDUMP_COMM": "comm", "COREDUMP_EXE": "exe", "COREHANDLER_ID": "id",
                  "COREDUMP_UID": "uid", "COREDUMP_SIGNAL": "signal", "COREDUMP_SIGNAL_NAME": "signal_name"}
FIELD_RE = re.compile(r"_?[A-Z][A-Z0-9_]*")


@dataclass(frozen=True)
class Filter:
    ids: tuple[str, ...] = ()          # exact ids or unique prefixes
    pids: tuple[int, ...] = ()
    comms: tuple[str, ...] = ()
    exes: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()        # words with '/': an exe (absolute, or relative to the cwd) or a comm
    since: float | None = None
    until: float | None = None
    signal: int | None = None
    last: int | None = None            # only the newest N
    uid: int | None = None             # only this user's dumps (the per-user views; no MATCH word)

    @property
    def by_name(self) -> bool:
        """True when the names (comm, exe) decide, which the index cannot compare byte for byte."""
        return bool(self.comms or self.exes or self.paths)

    def matches(self, d: Dump) -> bool:
        if self.ids and not any(d.id.startswith(i) for i in self.ids):
            return False
        if self.pids and d.pid not in self.pids:
            return False
        if self.comms and not set(comms(d.record)) & set(self.comms):
            return False
        if self.exes and d.exe not in self.exes:
            return False
        if self.paths and not any(d.exe == os.path.abspath(p) or p in comms(d.record) for p in self.paths):
            return False
        if self.since is not None and d.crashed_at < self.since:
            return False
        if self.until is not None and d.crashed_at > self.until:
            return False
        if self.signal is not None and d.signal != self.signal:
            return False
        return self.uid is None or d.uid == self.uid


def comms(record: dict) -> list[str]:
    """Every name the record gives the process: /proc's comm, and the kernel's %e form of it."""
    names = [fields.comm(record)]
    kernel = record.get("comm")
    if isinstance(kernel, str) and kernel not in names:
        names.append(kernel)
    return [n for n in names if n]


def select(dumps: Iterable[Dump], f: Filter) -> list[Dump]:
    """The dumps f matches (oldest first, as given), the newest `last` of them; refuses an ambiguous id prefix."""
    found = [d for d in dumps if f.matches(d)]
    for prefix in f.ids:
        named = {d.id for d in found if d.id.startswith(prefix)}
        if len(named) > 1 and prefix not in named:
            raise UsageError(f"id prefix {prefix!r} is ambiguous: {len(named)} dumps have it")
    return found[-f.last:] if f.last is not None else found


def parse(word: str) -> tuple[str, object]:
    """(kind, value) of one MATCH word; UsageError for a PID that is not one, or a field we cannot match."""
    key, sep, value = word.partition("=")
    if sep and key in KINDS:
        kind = key
    elif sep and key in JOURNAL_FIELDS:
        kind = JOURNAL_FIELDS[key]
    elif sep and key.startswith("_") and f"COREDUMP{key}" in JOURNAL_FIELDS:
        raise UsageError(f"{key}= names the process that logged a crash's journal entry, not the crashed one: "
                         f"match COREDUMP{key}={value} (or {JOURNAL_FIELDS['COREDUMP' + key]}=)")
    elif sep and FIELD_RE.fullmatch(key):
        raise UsageError(f"cannot match on the journal field {key}: corehandler matches "
                         + ", ".join(sorted(JOURNAL_FIELDS)) + " (and the analysis's: see --help)")
    elif sep and "/" not in key:  # a path may hold '=': `./build=1/app` stays a path
        raise UsageError(f"{word!r} is no journal match ({key!r} is not a field name): a comm holding '=' is "
                         f"matched as comm={word}")
    elif word.isdigit() and int(word) <= MAX_C_INT:
        kind, value = "pid", word
    elif spool.ID_PREFIX_RE.fullmatch(word):
        kind, value = "id", word
    elif "/" in word:
        kind, value = "path", word
    else:
        kind, value = "comm", word
    if kind in ("pid", "uid", "signal"):
        if not value.isdigit() or int(value) > MAX_C_INT:
            raise UsageError(f"not a {kind.upper() if kind != 'signal' else 'signal number'}: {value!r}")
        return kind, int(value)
    if kind == "signal_name":
        try:
            return "signal", int(signals.Signals[value.upper() if value.upper().startswith("SIG")
                                                 else "SIG" + value.upper()])
        except KeyError:
            raise UsageError(f"unknown signal {value!r}") from None
    return kind, value


def build(words: Iterable[str], **rest) -> Filter:
    """The Filter of MATCH words, with the other criteria (since, until, signal, last) as given."""
    kinds: dict[str, list] = {k: [] for k in (*KINDS, "path", "uid", "signal")}
    for word in words:
        kind, value = parse(word)
        kinds[kind].append(value)
    for kind in ("uid", "signal"):
        values = set(kinds[kind]) | ({rest[kind]} if rest.get(kind) is not None else set())
        if len(values) > 1:
            raise UsageError(f"several {kind}s to match ({', '.join(map(str, sorted(values)))}): a dump has one")
        if values:
            rest[kind] = values.pop()
    return Filter(ids=tuple(kinds["id"]), pids=tuple(kinds["pid"]), comms=tuple(kinds["comm"]),
                  exes=tuple(kinds["exe"]), paths=tuple(kinds["path"]), **rest)
