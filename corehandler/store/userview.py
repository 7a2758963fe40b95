"""What a user who is not root may see of the store: their own crashes of dumpable processes, as coredumpctl
allows (systemd-coredump gives the crashing uid a read ACL on the core), never anyone else's and never a
setuid or otherwise non-dumpable process's.

The index stays root's (0600: it holds every user's cmdlines and environments). Root (the daemon, and the CLI's
vacuum and corruption marks) publishes one view per uid:
  <state>/users/<uid>.json   that uid's visible dumps, as index rows with their records and their analysis
                             (the trace and signature `info` and `list` show, as coredumpctl shows a user's
                             own trace) (schema 1); mode
                             0600 root, plus the POSIX ACL entry user:<uid>:r--
  <state>/store/<id>.zst     each of those dumps' stored file gets the same ACL entry
The state, store and users directories are 0711 (paths.DIR_MODES): a user can open a name there but list
nothing, so they reach their own view by their uid and their cores by the ids in it, and nothing else. A dump is
visible when the record's uid (%u) is that user's, an ordinary user's (not a system, dynamic or nobody uid), its
dumpable (%d) is 1 (SUID_DUMP_USER), and its exec was clean (real == effective ids in its status, AT_SECURE 0 in
its core's auxv): systemd-coredump's rule. A setuid program's or a prctl(PR_SET_DUMPABLE, 0) process's dumps
(%d 0 or 2, or AT_SECURE 1) stay root's, as do orphans (no uid).

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

SCHEMA = 1
DUMPABLE_USER = 1  # SUID_DUMP_USER, the kernel's %d for an ordinary process
# systemd's own ranges (and Debian's SYS_UID_MAX): system users, dynamic users, nobody.
SYSTEM_UID_MAX = 999
DYNAMIC_UIDS = range(61184, 65520)
NOBODY = 65534
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


def visible(d: Dump) -> bool:
    """Whether the crashing user may see this dump: theirs, an ordinary user's, of a dumpable process that
    ran as exactly that user since its exec."""
    return ordinary_uid(d.uid) and d.record.get("dumpable") == DUMPABLE_USER and clean_exec(d)


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


def refresh(store: Store, uids: Iterable[int] | None = None) -> None:
    """Republishes the views of these uids (None: every uid with a view or a visible dump) from the index,
    and grants each visible stored file to its user. Root only; a filesystem without ACLs is logged, not
    fatal (users then see no view)."""
    state = store.state_dir
    users = paths.users_dir(state)
    for directory, kind in ((state, "state"), (store.store_dir, "store"), (users, "users")):
        directory.mkdir(mode=DIR_MODES[kind], parents=True, exist_ok=True)
        os.chmod(directory, DIR_MODES[kind])
    fd = os.open(users, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the daemon and a `vacuum` may refresh at once; one at a time
        if uids is None:
            published = {int(n[:-5]) for n in os.listdir(users) if n.endswith(".json") and n[:-5].isdigit()}
            uids = published | {r[0] for r in store.db.execute(
                "SELECT DISTINCT uid FROM dumps WHERE uid > 0 AND deleting = 0")}
        for uid in sorted(set(uids)):
            try:
                _publish(store, uid)
            except _NoAcl as e:
                log.warning("Cannot give user %d their dumps: %s has no POSIX ACLs (%s)", uid, state, e)
                view_path(state, uid).unlink(missing_ok=True)
    finally:
        os.close(fd)


def _publish(store: Store, uid: int) -> None:
    dumps = [d for d in store.query(Filter(uid=uid)) if visible(d)]
    path = view_path(store.state_dir, uid)
    if not dumps:
        path.unlink(missing_ok=True)
        return
    for d in dumps:
        stored = store.file_path(d)
        if stored is not None:
            try:
                _grant(stored, uid)
            except FileNotFoundError:  # retention took it after the query; the view says "missing"
                pass
    rows = [dataclasses.asdict(d) for d in dumps]
    ids = [d.id for d in dumps]
    results = {i: a for i in ids if (a := analyses.analysis_for(store, i)) is not None}
    # ensure_ascii: the names' invalid bytes stay lone-surrogate escapes, as in the spool record.
    data = json.dumps({"schema": SCHEMA, "uid": uid, "dumps": rows, "analysis": results,
                       "analysis_summaries": analyses.summaries(store, ids)},
                      ensure_ascii=True, sort_keys=True).encode()
    write_atomic(path, data, 0o600, prepare=lambda fd: _grant(fd, uid))


class UserView:
    """A user's published view, read like a Store (query, file_path) by the CLI run as that user."""

    readonly = True

    def __init__(self, state_dir: Path, uid: int):
        self.state_dir = Path(state_dir)
        self.store_dir = paths.store_dir(self.state_dir)
        self.uid = uid
        path = view_path(self.state_dir, uid)
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            if not os.access(paths.users_dir(self.state_dir), os.X_OK) and os.path.lexists(self.state_dir):
                raise _denied(self.state_dir) from None
            data = {"dumps": []}  # no dump of theirs, or no state dir at all
        except PermissionError:
            raise _denied(self.state_dir) from None
        fields = {f.name for f in dataclasses.fields(Dump)}
        self.dumps = [Dump(**{k: v for k, v in row.items() if k in fields}) for row in data.get("dumps", [])]
        self._analysis = data.get("analysis") or {}
        self._summaries = data.get("analysis_summaries") or {}

    def analysis_for(self, dump_id: str) -> dict | None:
        return self._analysis.get(dump_id)

    def analysis_summaries(self, ids: Iterable[str]) -> dict[str, dict]:
        return {i: self._summaries[i] for i in ids if i in self._summaries}

    def query(self, f: Filter = Filter()) -> list[Dump]:
        return match.select(self.dumps, f)

    def file_path(self, dump: Dump) -> Path | None:
        return self.store_dir / dump.path if dump.path else None

    def mark_corrupt(self, dump: Dump, problem: str) -> bool:
        return False  # the index is root's; root's next look marks it

    def close(self) -> None:
        pass

    def __enter__(self) -> "UserView":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _denied(state_dir: Path) -> NotRootError:
    return NotRootError(f"cannot read the dumps in {state_dir}: permission denied (root sees every dump; "
                        "other users see their own once the daemon has published them)")
