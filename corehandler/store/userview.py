"""What a user who is not root may see of the store: their own crashes of dumpable processes, as coredumpctl
allows (systemd-coredump gives the crashing uid a read ACL on the core), never anyone else's and never a
setuid or otherwise non-dumpable process's.

The index stays root's (0600: it holds every user's cmdlines and environments). Root (the daemon, and the CLI's
vacuum and corruption marks) publishes one view per uid:
  <state>/users/<uid>.json   that uid's visible dumps, as index rows with their records and their analysis
                             (the trace and signature `info` and `list` show, as coredumpctl shows a user's
                             own trace); mode 0600 root, plus the POSIX ACL entry user:<uid>:r--
  <state>/store/<id>.zst     each of those dumps' stored file gets the same ACL entry
The state, store and users directories are 0711 (paths.DIR_MODES): a user can open a name there but list
nothing, so they reach their own view by their uid and their cores by the ids in it, and nothing else. A dump is
visible when the record's uid (%u) is that user's, an ordinary user's (not a system, dynamic or nobody uid), its
dumpable (%d) is 1 (SUID_DUMP_USER), and its exec was clean (real == effective ids in its status, AT_SECURE 0 in
its core's auxv): systemd-coredump's rule. A setuid program's or a prctl(PR_SET_DUMPABLE, 0) process's dumps
(%d 0 or 2, or AT_SECURE 1) stay root's, as do orphans (no uid). And the uid must be the host user's, not a
container's that maps to the same number (issue 34: a pod as uid 1000 on a node whose login user is 1000):
the process ran in the host's namespaces, or in a user namespace that uid made (host_users()).

A view is a log (schema 2), so publishing costs what changed, not what the user has: a header line, then a
line per dump ({"dump": row, "analysis": ..., "summary": ...}) or per deletion ({"gone": id}); a reader keeps
the last line of each id and ignores a last line cut short by a writer. The daemon appends a line per ingest
and per deletion (update), and writes the view whole (refresh: at start, from `vacuum`, after a corruption
mark, and once the log has grown past twice its size when last written whole plus COMPACT_SLACK).

The CLI run as a user without read access to the index reads UserView instead of Store: the same query,
the same matching rule (match.py).
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import logging
import os
import struct
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

from corehandler import paths
from corehandler.atomicfile import write_atomic
from corehandler.errors import NotRootError
from corehandler.paths import DIR_MODES
from corehandler.store import analyses, match
from corehandler.store.dumprow import Dump
from corehandler.store.index import Store
from corehandler.store.match import Filter

log = logging.getLogger(__name__)

SCHEMA = 2
COMPACT_SLACK = 1 << 20
_HEADER_BYTES = 4096
DUMPABLE_USER = 1  # SUID_DUMP_USER, the kernel's %d for an ordinary process
# systemd's own ranges (and Debian's SYS_UID_MAX): system users, dynamic users, nobody.
SYSTEM_UID_MAX = 999
DYNAMIC_UIDS = range(61184, 65520)
NOBODY = 65534
# The initial namespaces' fixed inode numbers (PROC_*_INIT_INO, include/linux/proc_ns.h), as the record's
# proc.ns has them. The mount and network namespaces have no fixed number.
HOST_NAMESPACES = {"user": "user:[4026531837]", "pid": "pid:[4026531836]", "ipc": "ipc:[4026531839]",
                   "uts": "uts:[4026531838]", "cgroup": "cgroup:[4026531835]"}
# The record key the daemon adds at ingest: facts of the core's auxv ({"at_secure": N | None}).
AUXV_KEY = "auxv"
_ACL_XATTR = "system.posix_acl_access"
# <linux/posix_acl_xattr.h>: a version, then (tag, perm, id) entries sorted by tag (and id within a tag).
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_UNDEFINED_ID = 0xFFFFFFFF
_READ, _WRITE = 4, 2


def view_path(state_dir: Path, uid: int) -> Path:
    return paths.users_dir(state_dir) / f"{uid}.json"


def ordinary_uid(uid: object) -> bool:
    """A uid systemd-coredump would give a core to: not root or a system user (<= SYSTEM_UID_MAX), not a
    systemd dynamic user (DYNAMIC_UIDS), not nobody. Those are services' identities, shared or recycled: a
    dump of one is not "theirs" to any person who might log in as it."""
    return (isinstance(uid, int) and not isinstance(uid, bool) and SYSTEM_UID_MAX < uid < 2**32 - 1
            and uid not in DYNAMIC_UIDS and uid != NOBODY)


def _ids(status: object, key: str) -> list[str]:
    for line in (status if isinstance(status, str) else "").splitlines():
        if line.startswith(key + ":"):
            return line.split()[1:]
    return []


def clean_exec(d: Dump) -> bool:
    """Whether the process ran as exactly its user since its exec (systemd-coredump's rule since
    CVE-2025-4598): its /proc status, read by csplice at the crash, says real == effective uid and gid, and
    its core's auxv says AT_SECURE 0 (no setuid, setgid or file-capability exec, even one that later dropped
    its privileges and made itself dumpable). A dump without a core has no auxv: the status decides alone."""
    status = (d.record.get("proc") or {}).get("status")
    uids, gids = _ids(status, "Uid"), _ids(status, "Gid")
    if len(uids) < 2 or len(gids) < 2 or uids[0] != uids[1] or gids[0] != gids[1] or uids[0] != str(d.uid):
        return False
    if d.record.get("core") is None:
        return True
    return (d.record.get(AUXV_KEY) or {}).get("at_secure") == 0


def host_users(d: Dump) -> bool:
    """Whether the dump's uid is a person's on this host, not a container's that maps to the same number. In
    the initial user namespace: only a process in the host's PID, IPC, UTS and cgroup namespaces too, outside
    any container csplice recognised (leaving them takes a privilege the user lacks without a user namespace
    of their own, so a process outside them was put there by root: a container, a pod, a sandbox). In another
    user namespace: only when the user who made it (its owner, as csplice read it at the crash) is the dump's
    uid, as for `unshare -Ur` or a rootless container. Without the namespaces (/proc unreadable): no."""
    proc = d.record.get("proc") or {}
    ns = proc.get("ns") or {}
    if ns.get("user") == HOST_NAMESPACES["user"]:
        return proc.get("container") is None and all(ns.get(k) == v for k, v in HOST_NAMESPACES.items())
    return ns.get("user") is not None and proc.get("userns_owner") == d.uid


def visible(d: Dump) -> bool:
    """Whether the crashing user may see this dump: theirs, an ordinary user's, of a dumpable process that
    ran as exactly that user since its exec, on the host or in a user namespace they made."""
    return (ordinary_uid(d.uid) and d.record.get("dumpable") == DUMPABLE_USER and clean_exec(d)
            and host_users(d))


def read_acl(uid: int) -> bytes:
    """The ACL "owner rw, user uid r, nobody else anything" (a 0600 file's, plus one reader)."""
    entries = ((_USER_OBJ, _READ | _WRITE, _UNDEFINED_ID), (_USER, _READ, uid), (_GROUP_OBJ, 0, _UNDEFINED_ID),
               (_MASK, _READ, _UNDEFINED_ID), (_OTHER, 0, _UNDEFINED_ID))
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


def acl_readers(path_or_fd) -> list[int]:
    """The uids a file's ACL names (for tests and doctor-like checks); [] without an ACL."""
    try:
        blob = os.getxattr(path_or_fd, _ACL_XATTR)
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.EOPNOTSUPP):
            return []
        raise
    entries = [struct.unpack_from("<HHI", blob, 4 + 8 * i) for i in range((len(blob) - 4) // 8)]
    return [ident for tag, perm, ident in entries if tag == _USER and perm & _READ]


class _NoAcl(Exception):
    """The filesystem refuses POSIX ACLs: users cannot be given their cores."""


def _grant(target, uid: int) -> None:
    try:
        os.setxattr(target, _ACL_XATTR, read_acl(uid))
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
            raise _NoAcl(str(e)) from None
        raise


@contextmanager
def _users_locked(store: Store):
    """The users directory, made as install makes it, locked: the daemon and a `vacuum` may publish at once."""
    state = store.state_dir
    users = paths.users_dir(state)
    for directory, kind in ((state, "state"), (store.store_dir, "store"), (users, "users")):
        directory.mkdir(mode=DIR_MODES[kind], parents=True, exist_ok=True)
        os.chmod(directory, DIR_MODES[kind])
    fd = os.open(users, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield users
    finally:
        os.close(fd)


def refresh(store: Store, uids: Iterable[int] | None = None) -> None:
    """Republishes the views of these uids (None: every uid with a view or a visible dump) whole from the
    index, and grants each visible stored file to its user. Root only; a filesystem without ACLs is logged,
    not fatal (users then see no view)."""
    with _users_locked(store) as users:
        if uids is None:
            published = {int(n[:-5]) for n in os.listdir(users) if n.endswith(".json") and n[:-5].isdigit()}
            uids = published | {r[0] for r in store.db.execute(
                "SELECT DISTINCT uid FROM dumps WHERE uid > 0 AND deleting = 0")}
        for uid in sorted(set(uids)):
            _publish_whole(store, uid)


def update(store: Store, changed: Iterable[Dump] = (), gone: Iterable[tuple[str, int | None]] = ()) -> None:
    """Appends to the views the dumps changed (ingested) and gone ((id, uid) of deleted ones): a line each,
    whatever the view holds already. A view not there yet, or grown past its slack, is written whole."""
    lines: dict[int, list[bytes]] = defaultdict(list)
    whole_if_missing: set[int] = set()
    for d in changed:
        if visible(d):
            _grant_stored(store, d)
            lines[d.uid].append(_line(_entry(store, d)))
            whole_if_missing.add(d.uid)
    for dump_id, uid in gone:
        if isinstance(uid, int) and uid > 0:
            lines[uid].append(_line({"gone": dump_id}))
    if not lines:
        return
    with _users_locked(store):
        for uid, new in lines.items():
            appended = _append(view_path(store.state_dir, uid), b"".join(new))
            # No view: a user whose dumps were all invisible so far needs none for a deletion.
            if appended is False or (appended is None and uid in whole_if_missing):
                _publish_whole(store, uid)


def _line(obj: dict) -> bytes:
    # ensure_ascii: the names' invalid bytes stay lone-surrogate escapes, as in the spool record.
    return json.dumps(obj, ensure_ascii=True, sort_keys=True).encode() + b"\n"


def _entry(store: Store, d: Dump) -> dict:
    return {"dump": dataclasses.asdict(d), "analysis": analyses.analysis_for(store, d.id),
            "summary": analyses.summaries(store, [d.id]).get(d.id)}


def _grant_stored(store: Store, d: Dump) -> None:
    for stored in (store.file_path(d), store.mini_path(d)):  # the core and its mini core
        if stored is not None:
            try:
                _grant(stored, d.uid)
            except FileNotFoundError:  # retention took it since; the view says "missing"
                pass


def _append(path: Path, data: bytes) -> bool | None:
    """Appends data to the view at path: True; None when there is no view; False when the view must be
    written whole instead (an older schema, or grown past twice its compacted size plus the slack)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        with open(path, "rb") as f:
            first = f.readline(_HEADER_BYTES)
        try:
            header = json.loads(first)
        except ValueError:
            return False
        if not isinstance(header, dict) or header.get("schema") != SCHEMA:
            return False
        if os.fstat(fd).st_size + len(data) > 2 * int(header.get("compacted_bytes", 0)) + COMPACT_SLACK:
            return False
        view = memoryview(data)
        while view:  # one write() in practice: O_APPEND keeps concurrent readers to whole or cut-short lines
            view = view[os.write(fd, view):]
        return True
    finally:
        os.close(fd)


def _publish_whole(store: Store, uid: int) -> None:
    try:
        _publish(store, uid)
    except _NoAcl as e:
        log.warning("Cannot give user %d their dumps: %s has no POSIX ACLs (%s)", uid, store.state_dir, e)
        view_path(store.state_dir, uid).unlink(missing_ok=True)


def _publish(store: Store, uid: int) -> None:
    dumps = [d for d in store.query(Filter(uid=uid)) if visible(d)]
    path = view_path(store.state_dir, uid)
    if not dumps:
        path.unlink(missing_ok=True)
        return
    for d in dumps:
        _grant_stored(store, d)
    body = b"".join(_line(_entry(store, d)) for d in dumps)
    header = _line({"schema": SCHEMA, "uid": uid, "compacted_bytes": len(body)})
    write_atomic(path, header + body, 0o600, prepare=lambda fd: _grant(fd, uid))


def _replay(raw: bytes) -> tuple[list[dict], dict, dict]:
    """(rows, analyses by id, summaries by id) of a view: schema 2's log replayed (a line cut short by a
    writer at the end is skipped), or schema 1's single document."""
    lines = raw.splitlines()
    try:
        first = json.loads(lines[0]) if lines else {}
    except ValueError:
        first = {}
    if isinstance(first, dict) and "dumps" in first:  # schema 1, written whole by an older daemon
        return first.get("dumps") or [], first.get("analysis") or {}, first.get("analysis_summaries") or {}
    entries: dict[str, dict] = {}
    for line in lines[1:]:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if "gone" in entry:
            entries.pop(entry["gone"], None)
        elif isinstance(entry.get("dump"), dict):
            entries[entry["dump"]["id"]] = entry
    ordered = sorted(entries.values(), key=lambda e: (e["dump"]["crashed_at"], e["dump"]["id"]))
    return ([e["dump"] for e in ordered], {i: e["analysis"] for i, e in entries.items() if e.get("analysis")},
            {i: e["summary"] for i, e in entries.items() if e.get("summary")})


class UserView:
    """A user's published view, read like a Store (query, file_path) by the CLI run as that user."""

    readonly = True

    def __init__(self, state_dir: Path, uid: int):
        self.state_dir = Path(state_dir)
        self.store_dir = paths.store_dir(self.state_dir)
        self.uid = uid
        path = view_path(self.state_dir, uid)
        try:
            rows, self._analysis, self._summaries = _replay(path.read_bytes())
        except FileNotFoundError:
            if not os.access(paths.users_dir(self.state_dir), os.X_OK) and os.path.lexists(self.state_dir):
                raise _denied(self.state_dir) from None
            rows, self._analysis, self._summaries = [], {}, {}  # no dump of theirs, or no state dir at all
        except PermissionError:
            raise _denied(self.state_dir) from None
        fields = {f.name for f in dataclasses.fields(Dump)}
        self.dumps = [Dump(**{k: v for k, v in row.items() if k in fields}) for row in rows]

    def analysis_for(self, dump_id: str) -> dict | None:
        return self._analysis.get(dump_id)

    def analysis_summaries(self, ids: Iterable[str]) -> dict[str, dict]:
        return {i: self._summaries[i] for i in ids if i in self._summaries}

    def query(self, f: Filter = Filter()) -> list[Dump]:
        return match.select(self.dumps, f)

    def file_path(self, dump: Dump) -> Path | None:
        return self.store_dir / dump.path if dump.path else None

    def mini_path(self, dump: Dump) -> Path | None:
        return self.store_dir / dump.mini_path if dump.mini_path else None

    def mark_corrupt(self, dump: Dump, problem: str) -> bool:
        return False  # the index is root's; root's next look marks it

    def clear_corrupt(self, dump: Dump) -> bool:
        return False

    def close(self) -> None:
        pass

    def __enter__(self) -> "UserView":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _denied(state_dir: Path) -> NotRootError:
    return NotRootError(f"cannot read the dumps in {state_dir}: permission denied (root sees every dump; "
                        "other users see their own once the daemon has published them)")
