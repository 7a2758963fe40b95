"""store/attempts.py: the count of ingest attempts per record, kept in the index, and when a record is given up."""

from __future__ import annotations

import pytest

from corehandler.store import attempts
from corehandler.store.index import Store

ID = "1700000000000000-0123456789abcdef-42"


def test_attempts_are_counted_before_they_run_and_outlive_the_store(tmp_path):
    with Store(tmp_path) as s:
        assert attempts.begin(s, ID) == attempts.Attempt(1, 0, None)
        attempts.failed(s, ID, "OSError: [Errno 5] Input/output error")
    with Store(tmp_path) as s:  # a restarted daemon
        assert attempts.begin(s, ID) == attempts.Attempt(2, 1, "OSError: [Errno 5] Input/output error")
        attempts.undo(s, ID)  # stopped: does not count
        assert attempts.begin(s, ID).number == 2
        attempts.done(s, ID)
        assert attempts.begin(s, ID).number == 1


@pytest.mark.parametrize("attempt, expected", [
    (attempts.Attempt(1, 0, None), None),
    (attempts.Attempt(6, 4, "ValueError: x"), None),  # 4 failures, 1 death
    (attempts.Attempt(6, 5, "ValueError: x"),
     attempts.GiveUp("ingest failed 5 times, given up (last: ValueError: x)", True)),
    (attempts.Attempt(10, 0, None), None),  # 9 deaths: a daemon is killed for others' sake too
    (attempts.Attempt(11, 0, None), attempts.GiveUp("the daemon died 10 times while ingesting it, given up", True)),
    (attempts.Attempt(7, 6, "e", given_up=True),
     attempts.GiveUp("ingest failed 6 times, given up (last: e)", False)),  # the given-up attempt failed too
])
def test_a_record_is_given_up_past_the_limit_then_without_its_core(tmp_path, attempt, expected):
    with Store(tmp_path) as s:
        attempts.begin(s, ID)
        assert attempts.give_up(s, ID, attempt, 5) == expected
        assert attempts.begin(s, ID).given_up == (expected is not None)


def test_the_error_kept_is_bounded(tmp_path):
    with Store(tmp_path) as s:
        attempts.begin(s, ID)
        attempts.failed(s, ID, "x" * 100_000)
        assert len(attempts.begin(s, ID).last_error) == attempts.MAX_ERROR_CHARS
