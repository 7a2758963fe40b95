"""The retention planner: a table per rule, then properties over random stores and policies."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corehandler.store.retention import Item, Policy, apply, plan, violations

NOW = 1_000_000.0
DAY = 86400.0


def _items(spec):
    """spec: (id, age in days, exe, size[, busy])"""
    return [Item(s[0], NOW - s[1] * DAY, s[2], s[3], *(s[4:] or [False])) for s in spec]


def _deleted(decisions):
    return {d.item.id: d.rule for d in decisions if not d.keep}


STORE = [("a", 10, "/x", 100), ("b", 8, "/y", 200), ("c", 6, "/x", 300), ("d", 4, "/x", 400),
         ("e", 2, "/y", 500)]

TABLE = [
    # (name, policy, free_bytes, expected deletions)
    ("no limits", Policy(), 10_000, {}),
    ("zero means no limit", Policy(max_use=0, keep_free=0, max_age=0, max_count=0, max_per_exe=0), 0, {}),
    ("max_age", Policy(max_age=5 * DAY), 10_000, {"a": "max_age", "b": "max_age", "c": "max_age"}),
    ("max_age keeps the exact edge", Policy(max_age=10 * DAY), 10_000, {}),
    ("max_count", Policy(max_count=3), 10_000, {"a": "max_count", "b": "max_count"}),
    ("max_count satisfied", Policy(max_count=5), 10_000, {}),
    ("max_per_exe", Policy(max_per_exe=1), 10_000, {"a": "max_per_exe", "c": "max_per_exe", "b": "max_per_exe"}),
    ("max_per_exe 2", Policy(max_per_exe=2), 10_000, {"a": "max_per_exe"}),
    ("max_use oldest first", Policy(max_use=1000), 10_000, {"a": "max_use", "b": "max_use", "c": "max_use"}),
    ("max_use exact fit", Policy(max_use=1500), 10_000, {}),
    ("keep_free", Policy(keep_free=1250), 1000, {"a": "keep_free", "b": "keep_free"}),
    ("keep_free unreachable deletes all", Policy(keep_free=10**9), 0,
     {k: "keep_free" for k in "abcde"}),
    ("age then count", Policy(max_age=9 * DAY, max_count=2), 10_000,
     {"a": "max_age", "b": "max_count", "c": "max_count"}),
    ("per exe then use", Policy(max_per_exe=2, max_use=800), 10_000,
     {"a": "max_per_exe", "b": "max_use", "c": "max_use", "d": "max_use"}),
    ("first broken global rule is named", Policy(max_count=4, max_use=1000), 10_000,
     {"a": "max_count", "b": "max_use", "c": "max_use"}),
]


@pytest.mark.parametrize("name,policy,free,expected", TABLE, ids=[t[0] for t in TABLE])
def test_rules(name, policy, free, expected):
    decisions = plan(_items(STORE), policy, free_bytes=free, now=NOW)
    assert [d.item.id for d in decisions] == list("abcde")
    assert _deleted(decisions) == expected


# b and d are records without a stored core (metadata only).
MIXED = [Item(i, NOW - age * DAY, "/x", size, coreless=coreless)
         for i, age, size, coreless in [("a", 10, 100, False), ("b", 8, 5, True), ("c", 6, 300, False),
                                        ("d", 4, 5, True), ("e", 2, 5, True)]]
METADATA_TABLE = [
    ("metadata age", Policy(dropped_max_age=5 * DAY), {"b": "dropped_max_age"}),
    ("metadata count keeps the newest", Policy(dropped_max_count=1),
     {"b": "dropped_max_count", "d": "dropped_max_count"}),
    ("metadata age then count", Policy(dropped_max_age=5 * DAY, dropped_max_count=1),
     {"b": "dropped_max_age", "d": "dropped_max_count"}),
    ("a dump with a core is not metadata", Policy(dropped_max_age=1), {"b": "dropped_max_age",
                                                                              "d": "dropped_max_age",
                                                                              "e": "dropped_max_age"}),
    ("the global limits still count them", Policy(dropped_max_count=2, max_count=2),
     {"a": "max_count", "b": "dropped_max_count", "c": "max_count"}),
]


@pytest.mark.parametrize("name,policy,expected", METADATA_TABLE, ids=[t[0] for t in METADATA_TABLE])
def test_metadata_only_rules(name, policy, expected):
    assert _deleted(plan(MIXED, policy, free_bytes=10_000, now=NOW)) == expected


def test_busy_dumps_are_never_deleted_but_count():
    items = _items([("a", 10, "/x", 100, True), ("b", 8, "/x", 100), ("c", 1, "/x", 100)])
    assert _deleted(plan(items, Policy(max_count=1), free_bytes=0, now=NOW)) == \
        {"b": "max_count", "c": "max_count"}
    assert _deleted(plan(items, Policy(max_age=DAY / 2), free_bytes=0, now=NOW)) == \
        {"b": "max_age", "c": "max_age"}
    assert _deleted(plan(items, Policy(max_per_exe=2), free_bytes=0, now=NOW)) == \
        {"b": "max_per_exe"}


def test_max_per_exe_counts_per_user():
    """Sixteen dumps of /usr/bin/sleep by uid 1000 push out none of root's: the cap holds per (uid, exe)."""
    items = [Item(f"u{n:02d}", NOW - n, "/usr/bin/sleep", 1, uid=1000) for n in range(16)]
    items.append(Item("root", NOW - 100, "/usr/bin/sleep", 1, uid=0))
    deleted = _deleted(plan(items, Policy(max_per_exe=2), free_bytes=0, now=NOW))
    assert "root" not in deleted and len(deleted) == 14 and set(deleted.values()) == {"max_per_exe"}


def test_dropped_max_count_takes_from_the_storming_user_first():
    """Issue 34: a thousand coreless records of uid 1000, newer than root's and another user's few, past
    dropped_max_count: v0.4 deleted the oldest of every user (root's first); now the storm deletes its own."""
    storm = [Item(f"s{n:04d}", NOW - n, "/x", 5, uid=1000, coreless=True) for n in range(1000)]
    others = [Item(f"root{n}", NOW - 5000 - n, "/x", 5, uid=0, coreless=True) for n in range(3)]
    others += [Item(f"u{n}", NOW - 6000 - n, "/x", 5, uid=1001, coreless=True) for n in range(3)]
    deleted = _deleted(plan(storm + others, Policy(dropped_max_count=100), free_bytes=0, now=NOW))
    assert len(deleted) == 906 and all(i.startswith("s") for i in deleted)
    assert set(deleted.values()) == {"dropped_max_count"}
    # The storm keeps its newest.
    assert all(f"s{n:04d}" not in deleted for n in range(94))


def test_dropped_max_count_evens_out_users_and_spares_root_among_equals():
    items = [Item(f"{who}{n}", NOW - n, "/x", 5, uid=uid, coreless=True)
             for who, uid in (("r", 0), ("a", 1000), ("b", 1001)) for n in range(4)]
    deleted = _deleted(plan(items, Policy(dropped_max_count=9), free_bytes=0, now=NOW))
    assert sorted(deleted) == ["a3", "b3", "r3"]
    deleted = _deleted(plan(items, Policy(dropped_max_count=10), free_bytes=0, now=NOW))
    assert sorted(deleted) == ["a3", "b3"]


def test_ties_in_time_break_on_id():
    items = [Item(i, NOW, None, 1) for i in "dbca"]
    assert _deleted(plan(items, Policy(max_count=2), free_bytes=0, now=NOW)) == \
        {"a": "max_count", "b": "max_count"}


def test_apply_deletes_and_reports_reasons():
    decisions = plan(_items(STORE), Policy(max_count=3), free_bytes=0, now=NOW)
    calls = []
    done = apply(decisions, lambda i, rule: calls.append((i, rule)) or 4096)
    assert calls == [("a", "max_count"), ("b", "max_count")]
    assert [(d.id, d.exe, d.rule, d.freed_bytes) for d in done] == [("a", "/x", "max_count", 4096),
                                                                   ("b", "/y", "max_count", 4096)]
    calls.clear()
    dry = apply(decisions, lambda i, rule: calls.append(i) or 0, dry_run=True)
    assert calls == [] and [(d.id, d.freed_bytes) for d in dry] == [("a", 100), ("b", 200)]


# -- properties --------------------------------------------------------------------------------------------

items_st = st.lists(
    st.builds(Item, id=st.text("abcdef0123", min_size=1, max_size=6), time=st.floats(NOW - 30 * DAY, NOW),
              exe=st.sampled_from(["/a", "/b", "/c", None]), size=st.integers(0, 1000), busy=st.booleans(),
              uid=st.sampled_from([0, 1000, None])),
    max_size=25, unique_by=lambda i: i.id)
limit = st.one_of(st.none(), st.integers(1, 6))
policy_st = st.builds(Policy, max_use=st.one_of(st.none(), st.integers(1, 8000)),
                      keep_free=st.one_of(st.none(), st.integers(1, 8000)),
                      max_age=st.one_of(st.none(), st.floats(DAY, 20 * DAY)),
                      max_count=limit, max_per_exe=limit)
free_st = st.integers(0, 8000)


def _split(items, decisions):
    kept = [d.item for d in decisions if d.keep]
    deleted = [d.item for d in decisions if not d.keep]
    return kept, deleted


@settings(max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", "300")), deadline=None)
@given(items_st, policy_st, free_st)
def test_property_deterministic_and_total(items, policy, free):
    a = plan(items, policy, free_bytes=free, now=NOW)
    b = plan(list(reversed(items)), policy, free_bytes=free, now=NOW)
    assert a == b
    assert sorted(d.item.id for d in a) == sorted(i.id for i in items)
    assert all(d.keep == (d.rule is None) for d in a)
    assert not any(d.item.busy and not d.keep for d in a)


@settings(max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", "300")), deadline=None)
@given(items_st, policy_st, free_st)
def test_property_never_keeps_a_violating_set_when_a_deletion_could_fix_it(items, policy, free):
    decisions = plan(items, policy, free_bytes=free, now=NOW)
    kept, deleted = _split(items, decisions)
    free_after = free + sum(i.size for i in deleted)
    broken = violations(kept, policy, free_bytes=free_after, now=NOW)
    if broken:
        # Only busy dumps can be what still breaks a limit, or nothing deletable is left at all.
        deletable = [i for i in kept if not i.busy]
        for rule in broken:
            if rule == "max_age":
                assert all(i.busy for i in kept if i.time < NOW - policy.max_age)
            elif rule == "max_per_exe":
                for key in {(i.uid, i.exe) for i in kept}:
                    group = [i for i in kept if (i.uid, i.exe) == key]
                    if len(group) > policy.max_per_exe:
                        assert all(i.busy for i in group)
            else:
                assert deletable == [], (rule, kept)


@settings(max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", "300")), deadline=None)
@given(items_st, policy_st, free_st)
def test_property_never_deletes_more_than_needed(items, policy, free):
    """Each deletion is required: by age it is too old; per executable, keeping it would break the cap;
    by a global rule, keeping the youngest one deleted would break a global limit."""
    decisions = plan(items, policy, free_bytes=free, now=NOW)
    kept, deleted = _split(items, decisions)
    rules = {d.item.id: d.rule for d in decisions}
    free_after = free + sum(i.size for i in deleted)
    for item in deleted:
        if rules[item.id] == "max_age":
            assert item.time < NOW - policy.max_age
        elif rules[item.id] == "max_per_exe":
            # The same user's dumps of the executable that the cap let stay (busy ones count): already at the cap.
            stayed = [i for i in items if (i.uid, i.exe) == (item.uid, item.exe) and
                      rules[i.id] not in ("max_age", "max_per_exe")]
            assert len(stayed) >= policy.max_per_exe
            # and they are the newest non-busy ones, or busy
            assert all(i.busy or (i.time, i.id) > (item.time, item.id) for i in stayed)
    global_deleted = [i for i in deleted if rules[i.id] in ("max_count", "max_use", "keep_free")]
    if global_deleted:
        youngest = max(global_deleted, key=lambda i: (i.time, i.id))
        with_it = kept + [youngest]
        broken = violations(with_it, Policy(max_use=policy.max_use, keep_free=policy.keep_free,
                                            max_count=policy.max_count),
                            free_bytes=free_after - youngest.size, now=NOW)
        assert broken, youngest


UNSENT_TABLE = [
    # (name, policy, free_bytes, expected deletions) over STORE with a and c still waiting to upload
    ("max_age passes over unsent", Policy(max_age=5 * DAY), 10_000, {"b": "max_age"}),
    ("max_count takes younger sent ones", Policy(max_count=3), 10_000, {"b": "max_count", "d": "max_count"}),
    # unsent dumps count toward the cap, like busy ones: the newest sent one of /x goes instead
    ("max_per_exe passes over unsent", Policy(max_per_exe=1), 10_000, {"b": "max_per_exe", "d": "max_per_exe"}),
    ("max_use passes over unsent", Policy(max_use=1000), 10_000, {"b": "max_use", "d": "max_use"}),
    ("keep_free, the disk floor, takes unsent too", Policy(keep_free=1250), 1000,
     {"a": "keep_free", "b": "keep_free"}),
    ("keep_free with max_use: only the floor takes unsent", Policy(max_use=1000, keep_free=1150), 1000,
     {"a": "keep_free", "b": "max_use", "d": "max_use"}),
]


@pytest.mark.parametrize("name,policy,free,expected", UNSENT_TABLE, ids=[t[0] for t in UNSENT_TABLE])
def test_dumps_waiting_to_upload_go_only_for_the_disk_floor(name, policy, free, expected):
    items = [Item(i.id, i.time, i.exe, i.size, unsent=i.id in ("a", "c")) for i in _items(STORE)]
    assert _deleted(plan(items, policy, free_bytes=free, now=NOW)) == expected


@settings(max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", "300")), deadline=None)
@given(items_st, policy_st, free_st, st.data())
def test_property_unsent_dumps_are_deleted_by_keep_free_only(items, policy, free, data):
    unsent = data.draw(st.sets(st.sampled_from([i.id for i in items])) if items else st.just(set()))
    items = [Item(i.id, i.time, i.exe, i.size, i.busy, i.id in unsent) for i in items]
    for d in plan(items, policy, free_bytes=free, now=NOW):
        if d.item.unsent and not d.keep:
            assert d.rule == "keep_free"
