"""Retention: a pure planner (dumps + policy + filesystem figures -> keep/delete and the rule that decided)
and a thin applier that deletes what the plan says.

Rules, in the order they apply:
  max_age      dumps older than this go, whatever else holds;
  dropped_max_age, dropped_max_count
               the same for dumps whose core was not kept (dropped, or invalid without one), on by
               default: each is a record of up to hundreds of KiB in the index and its user's view, and a crash
               storm or a hostile argv makes them by the thousand. dropped_max_count is per user first: the
               excess is taken from whichever user then holds the most, oldest first, so one user's storm
               deletes its own records and never root's or another user's (docs/design.md, threat model);
  max_per_exe  per executable and user, only the newest N stay (one user's crashes never push out another's);
  max_count, max_use, keep_free
               then, oldest first, dumps go while any of these is violated: more than max_count dumps,
               more than max_use bytes stored (a dump's file, its record and its analysis in the index), less than
               keep_free bytes free on the store's filesystem.
A dump marked busy (still being ingested or read) is never deleted, though it counts toward the limits.
A dump still waiting to upload (unsent) is deleted by keep_free only, the disk floor: the other rules pass
over it until it is in the bucket. When keep_free takes one, the caller counts it as lost to the fleet.

Mini cores (analysis/minicore.py) outlive the full ones: a dump that has one loses only its full core to
these rules, and keeps its row and mini core. Dumps left with only a mini core are planned apart, by the
policy's `mini` rules (mini_max_age, mini_max_count, mini_max_use, and keep_free), with the mini's size;
mini_max_age unset is max_age, so an age limit takes the whole dump, mini core included.
"""

from __future__ import annotations

import heapq
import logging
import os
import time
from collections import defaultdict, deque
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Sequence

from corehandler import paths, spool
from corehandler.store import upload_queue

log = logging.getLogger(__name__)

RULES = ("max_age", "dropped_max_age", "dropped_max_count", "max_per_exe", "max_count", "max_use",
         "keep_free")
MINI_RULES = ("mini_max_age", "mini_max_count", "mini_max_use")


@dataclass(frozen=True)
class Item:
    id: str
    time: float        # when it crashed, epoch seconds
    exe: str | None
    size: int          # bytes it occupies in the store
    busy: bool = False
    unsent: bool = False  # waiting in the upload queue
    uid: int | None = None  # who crashed: max_per_exe counts per (uid, exe)
    coreless: bool = False  # no stored core: a record only


@dataclass(frozen=True)
class Policy:
    """Resolved limits; None (or 0 from the config) means no limit."""
    max_use: int | None = None      # bytes
    keep_free: int | None = None    # bytes
    max_age: float | None = None    # seconds
    max_count: int | None = None
    max_per_exe: int | None = None
    dropped_max_age: float | None = None   # seconds, for coreless dumps
    dropped_max_count: int | None = None
    mini: "Policy | None" = None     # the rules of dumps left with only their mini core


@dataclass(frozen=True)
class Decision:
    item: Item
    keep: bool
    rule: str | None  # the rule that deleted it; None when kept


def _limit(value):
    return value if value else None


def _global_broken(policy: Policy, count: int, used: int, free: int) -> list[str]:
    broken = []
    if _limit(policy.max_count) is not None and count > policy.max_count:
        broken.append("max_count")
    if _limit(policy.max_use) is not None and used > policy.max_use:
        broken.append("max_use")
    if _limit(policy.keep_free) is not None and free < policy.keep_free:
        broken.append("keep_free")
    return broken


def _largest_holders_first(items: list[Item], limit: int) -> list[Item]:
    """The items (oldest first) past limit, each the oldest of whichever uid then holds the most; among equals
    root's last, then the lower uid's: what one user adds comes out of that user's own."""
    by_uid: dict[int | None, deque[Item]] = defaultdict(deque)
    for it in items:
        by_uid[it.uid].append(it)
    heap = [(-len(q), uid == 0, -1 if uid is None else uid, uid) for uid, q in by_uid.items()]
    heapq.heapify(heap)
    taken = []
    for _ in range(max(0, len(items) - limit)):
        count, is_root, order, uid = heapq.heappop(heap)
        taken.append(by_uid[uid].popleft())
        if count + 1 < 0:
            heapq.heappush(heap, (count + 1, is_root, order, uid))
    return taken


def plan(items: Iterable[Item], policy: Policy, *, free_bytes: int, now: float) -> list[Decision]:
    """Decides every item's fate, oldest first in the result. Deterministic: ties in time break on id."""
    ordered = sorted(items, key=lambda i: (i.time, i.id))
    rule: dict[str, str] = {}

    if _limit(policy.max_age) is not None:
        for it in ordered:
            if not it.busy and not it.unsent and it.time < now - policy.max_age:
                rule[it.id] = "max_age"

    coreless = [it for it in ordered if it.coreless and it.id not in rule and not it.busy and not it.unsent]
    if _limit(policy.dropped_max_age) is not None:
        for it in coreless:
            if it.time < now - policy.dropped_max_age:
                rule[it.id] = "dropped_max_age"
    if _limit(policy.dropped_max_count) is not None:
        for it in _largest_holders_first([it for it in coreless if it.id not in rule], policy.dropped_max_count):
            rule[it.id] = "dropped_max_count"

    if _limit(policy.max_per_exe) is not None:
        by_exe: dict[tuple[int | None, str | None], list[Item]] = defaultdict(list)
        for it in ordered:
            if it.id not in rule:
                by_exe[it.uid, it.exe].append(it)
        for group in by_exe.values():
            excess = len(group) - policy.max_per_exe
            for it in group:  # oldest first
                if excess <= 0:
                    break
                if not it.busy and not it.unsent:
                    rule[it.id] = "max_per_exe"
                    excess -= 1

    remaining = [it for it in ordered if it.id not in rule]
    count = len(remaining)
    used = sum(it.size for it in remaining)
    free = free_bytes + sum(it.size for it in ordered if it.id in rule)
    for it in remaining:
        broken = _global_broken(policy, count, used, free)
        if not broken:
            break
        if it.busy:
            continue
        if it.unsent:
            if "keep_free" not in broken:
                continue
            broken = ["keep_free"]
        rule[it.id] = broken[0]
        count -= 1
        used -= it.size
        free += it.size

    return [Decision(it, it.id not in rule, rule.get(it.id)) for it in ordered]


def violations(kept: Sequence[Item], policy: Policy, *, free_bytes: int, now: float) -> list[str]:
    """The rules a set of kept items breaks (free_bytes as it would be with only these kept)."""
    broken = []
    if _limit(policy.max_age) is not None and any(it.time < now - policy.max_age for it in kept):
        broken.append("max_age")
    if _limit(policy.max_per_exe) is not None:
        counts: dict[tuple[int | None, str | None], int] = defaultdict(int)
        for it in kept:
            counts[it.uid, it.exe] += 1
        if any(c > policy.max_per_exe for c in counts.values()):
            broken.append("max_per_exe")
    broken += _global_broken(policy, len(kept), sum(it.size for it in kept), free_bytes)
    return broken


@dataclass(frozen=True)
class Deletion:
    id: str
    exe: str | None
    rule: str
    freed_bytes: int
    uid: int | None = None
    kept_mini: bool = False   # only the full core went: the dump stays, with its mini core


def apply(decisions: Iterable[Decision], delete: Callable[[str, str], int | None], *,
          dry_run: bool = False) -> list[Deletion]:
    """Deletes what the plan says through delete(id, rule) -> freed bytes (None: another process deleted
    it first, and counts it), logging each deletion with its reason."""
    done = []
    for d in decisions:
        if d.keep:
            continue
        freed = d.item.size if dry_run else delete(d.item.id, d.rule)
        if freed is None:
            continue
        if not dry_run:
            log.info("Retention deleted dump %s (%s, %d bytes): %s", d.item.id, d.item.exe, freed, d.rule)
        done.append(Deletion(d.item.id, d.item.exe, d.rule, freed, d.item.uid))
    return done


def filesystem(path) -> tuple[int, int]:
    """Total and available bytes of the filesystem holding path."""
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def policy_from_config(retention, total_bytes: int) -> Policy:
    """Resolves the config's [retention] section (percentages against the filesystem's size)."""
    keep_free = retention.keep_free.resolve(total_bytes)
    # An admin's max_age is a promise that nothing of a crash outlives it: a mini core holds the stacks' memory,
    # so it goes with the rest unless mini_max_age says otherwise.
    mini = Policy(max_use=retention.mini_max_use.resolve(total_bytes), keep_free=keep_free,
                  max_age=retention.mini_max_age or retention.max_age or None,
                  max_count=retention.mini_max_count or None)
    return Policy(max_use=retention.max_use.resolve(total_bytes), keep_free=keep_free,
                  max_age=retention.max_age or None, max_count=retention.max_count or None,
                  max_per_exe=retention.max_per_exe or None,
                  dropped_max_age=retention.dropped_max_age or None,
                  dropped_max_count=retention.dropped_max_count or None, mini=mini)


def vacuum(store, policy: Policy, *, now: float | None = None, busy: Iterable[str] = (),
           dry_run: bool = False) -> list[Deletion]:
    """Plans against the store's index and filesystem, then deletes (unless dry_run)."""
    if not any((policy.max_use, policy.keep_free, policy.max_age, policy.max_count, policy.max_per_exe,
                policy.dropped_max_age, policy.dropped_max_count)):
        return []  # no limits: nothing to read
    # A dump whose spool record is still there has not finished ingest (a kill between its index row and the
    # cleanup): the daemon completes it from that record, so its row must still be there.
    # A dump still compressing has no stored file yet: the daemon completes its row.
    busy = set(busy) | set(spool.committed_ids(paths.spool_dir(store.state_dir))) | set(store.compressing())
    unsent = upload_queue.waiting_ids(store.db)
    minis = store.minis()
    now = time.time() if now is None else now
    items = [Item(i, t, exe, size, i in busy, i in unsent, uid, coreless)
             for i, t, exe, size, coreless, uid in store.sizes() if i not in minis or minis[i][0]]
    _, free = filesystem(store.store_dir)
    decisions = plan(items, policy, free_bytes=free, now=now)

    def delete(dump_id: str, rule: str) -> int | None:
        # The store counts each deletion under its rule, for the metrics; a dump with a mini core keeps it.
        dump = store.get(dump_id)
        return store.drop_full_core(dump, rule) if dump_id in minis else store.delete(dump, rule)

    deleted = [replace(d, kept_mini=d.id in minis) for d in apply(decisions, delete, dry_run=dry_run)]
    if policy.mini is not None:
        deleted += _vacuum_minis(store, policy.mini, minis, {d.id for d in deleted}, busy, now, dry_run)
    for d in deleted:
        if d.id in unsent and not dry_run:
            log.error("Retention had to delete %s before it was uploaded (%s): lost to the fleet", d.id, d.rule)
            upload_queue.mark_lost(store.db, d.id, f"deleted by retention ({d.rule}) before it was uploaded")
    return deleted


def _vacuum_minis(store, policy: Policy, minis: dict[str, tuple[bool, int]], demoted: set[str], busy: set[str],
                  now: float, dry_run: bool) -> list[Deletion]:
    """The dumps left with only a mini core (some just now), planned by the mini rules with the mini's size."""
    if not any((policy.max_use, policy.keep_free, policy.max_age, policy.max_count)):
        return []
    items = [Item(i, t, exe, minis[i][1], i in busy, uid=uid) for i, t, exe, _, _, uid in store.sizes()
             if i in minis and (not minis[i][0] or i in demoted)]
    _, free = filesystem(store.store_dir)
    decisions = [d for d in plan(items, policy, free_bytes=free, now=now) if not d.keep]
    decisions = [replace(d, rule=f"mini_{d.rule}" if d.rule != "keep_free" else d.rule) for d in decisions]
    return apply(decisions, lambda dump_id, rule: store.delete(store.get(dump_id), rule), dry_run=dry_run)
