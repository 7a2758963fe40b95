"""The spool record parses with the schema docs/design.md documents (support/record_schema.py checks every
record any test produces; these tests pin the values)."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from support.csplice_harness import Handler, core_args
from support.record_schema import SPECIFIERS, check_record


@pytest.fixture
def handler(tmp_path):
    return Handler(tmp_path / "h")


def test_record_values_follow_the_specifiers_and_proc(handler):
    t0 = time.time_ns()
    args = core_args(os.getpid(), comm="pytest-crash", signal=6)
    result = handler.feed(1 << 20, args=args)
    rec = result.record
    raw = json.loads((handler.spool / (rec["id"] + ".json")).read_bytes())
    check_record(raw)
    assert rec["specifiers"] == dict.fromkeys(SPECIFIERS) | dict(zip(SPECIFIERS, (a.decode() for a in args)))
    assert rec["specifiers"]["e"] == "pytest-crash" and rec["specifiers"]["F"] is None
    assert (rec["pid"], rec["tid"], rec["uid"], rec["gid"], rec["signal"], rec["dumpable"]) == \
        (os.getpid(), os.getpid(), os.getuid(), os.getgid(), 6, 1)
    assert rec["hostname"] == socket.gethostname() and rec["comm"] == "pytest-crash"
    assert rec["boot_id"] == open("/proc/sys/kernel/random/boot_id").read().strip().replace("-", "")
    us, boot, pid = rec["id"].split("-")
    assert boot == rec["boot_id"][:16] and int(pid) == os.getpid()
    assert t0 // 1000 <= int(us) <= time.time_ns() // 1000
    assert t0 <= rec["handler"]["started_realtime_ns"] <= time.time_ns()
    assert rec["proc"]["exe"] == os.readlink("/proc/self/exe")
    assert rec["proc"]["cmdline"] == [a.decode() for a in open("/proc/self/cmdline", "rb").read().split(b"\0")[:-1]]
    assert (rec["proc"]["verified_by"], rec["proc"]["verified"]) == ("start_time", True)
    cap = rec["capture"]
    assert cap["ns"] > 0 and cap["throughput_bytes_per_second"] == pytest.approx(cap["bytes"] * 1e9 / cap["ns"],
                                                                                    rel=1e-4)


def test_missing_specifiers_are_null(handler):
    result = handler.run(stdin=b"\x7fELF", args=[str(os.getpid()).encode(), b"", b"7"])
    rec = result.record
    assert result.returncode == 0
    assert rec["specifiers"]["i"] is None and rec["specifiers"]["I"] == "7" and rec["specifiers"]["e"] is None
    assert (rec["tid"], rec["uid"], rec["signal"], rec["comm"], rec["hostname"]) == (7, None, None, None, None)
    assert any("Only 3 of 11" in e for e in rec["errors"])


def test_out_of_range_numbers_are_null_not_wrapped(handler, tmp_path):
    """A number past 64 bits is null, not wrapped. (A PID past int is no PID: test_csplice_caller.py.)"""
    args = core_args(os.getpid())
    args[6] = b"99999999999999999999"
    rec = handler.run(stdin=b"\x7fELF", args=args).record
    assert rec["signal"] is None and rec["specifiers"]["s"] == "99999999999999999999"


def test_extra_arguments_are_ignored(handler):
    args = core_args(os.getpid(), pidfd=None) + [b"", b"extra1", b"extra2"]
    rec = handler.run(stdin=b"\x7fELF", args=args).record
    assert rec["specifiers"]["F"] is None and rec["capture"]["complete"]


def test_schema_checker_rejects_a_broken_record(handler):
    rec = handler.feed(4096).record
    rec["capture"]["truncated_reason"] = "bored"
    with pytest.raises(AssertionError, match="truncated_reason"):
        check_record(rec)
