"""How often ingest has tried each spool record, kept in the index so the count outlives the daemon.

A record is hostile input: one that makes ingest fail, hang past its budgets or kill the daemon outright must
not be retried forever (it would hold a max_pending slot of csplice's for good, and enough of them make every
later crash on the host a dropped dump). So an attempt is counted *before* it runs, and its end is noted when
it fails; an attempt with no end noted is one the daemon died in. A record is given up after `limit` failed
attempts, or after twice as many deaths (a daemon is also killed for reasons that are not the record's: a
restart, the OOM killer choosing it for another's sake). Given up, it is indexed as invalid with the reason and
its core is stored without analysis; should that fail as well, the next attempt indexes it without its core.
A stop (SIGTERM) or a full disk is not the record's fault and does not count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# A transient failure (an I/O error) gets this many tries, retry_interval apart.
MAX_ATTEMPTS = 5
MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class Attempt:
    number: int              # 1 for the first
    failures: int            # earlier attempts that failed and said why
    last_error: str | None   # the last of those reasons
    given_up: bool = False   # an earlier attempt was already made as given up


@dataclass(frozen=True)
class GiveUp:
    reason: str
    keep_core: bool  # the first attempt given up still stores the core; if even that fails, it goes


def begin(store, dump_id: str) -> Attempt:
    """Counts an attempt at dump_id, durably, before it is made."""
    with store.db:
        number, failures, last_error, given_up = store.db.execute(
            "INSERT INTO ingest_attempts (id, attempts, failures, last_error, last_at) VALUES (?, 1, 0, NULL, ?) "
            "ON CONFLICT (id) DO UPDATE SET attempts = attempts + 1, last_at = excluded.last_at "
            "RETURNING attempts, failures, last_error, given_up", (dump_id, time.time())).fetchone()
    return Attempt(number, failures, last_error, bool(given_up))


def failed(store, dump_id: str, error: str) -> None:
    with store.db:
        store.db.execute("UPDATE ingest_attempts SET failures = failures + 1, last_error = ? WHERE id = ?",
                         (error[:MAX_ERROR_CHARS], dump_id))


def undo(store, dump_id: str) -> None:
    """The attempt did not count: ingest was stopped, or waits for room on the disk."""
    with store.db:
        store.db.execute("UPDATE ingest_attempts SET attempts = attempts - 1 WHERE id = ?", (dump_id,))


def done(store, dump_id: str) -> None:
    with store.db:
        store.db.execute("DELETE FROM ingest_attempts WHERE id = ?", (dump_id,))


def prune(store, pending: set[str]) -> None:
    """Forgets the counts of records no longer in the spool (a kill after their cleanup left the count)."""
    stale = [(i,) for (i,) in store.db.execute("SELECT id FROM ingest_attempts") if i not in pending]
    with store.db:
        store.db.executemany("DELETE FROM ingest_attempts WHERE id = ?", stale)


def give_up(store, dump_id: str, attempt: Attempt, limit: int) -> GiveUp | None:
    """How to make this attempt given up (noted in the index), or None while the record still gets a normal
    one."""
    deaths = attempt.number - 1 - attempt.failures
    if attempt.failures < limit and deaths < 2 * limit:
        return None
    with store.db:
        store.db.execute("UPDATE ingest_attempts SET given_up = 1 WHERE id = ?", (dump_id,))
    if attempt.failures >= limit:
        reason = f"ingest failed {attempt.failures} times, given up (last: {attempt.last_error})"
    else:
        reason = f"the daemon died {deaths} times while ingesting it, given up"
    return GiveUp(reason, not attempt.given_up)
