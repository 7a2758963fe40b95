"""glibc's abort message: where its address comes from (analysis/reason.py), against the host's libc and
readelf. The jail reads `__abort_msg` from libc's file as it vets that path as the crashing user
(jail._read_facts); the daemon only takes that value, and only for the core's own libc (its build-id)."""

import os
import subprocess

import pytest

from corehandler import elffile
from corehandler.analysis import jail, reason

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def test_the_jail_reads_abort_msg_from_libc_and_the_daemon_takes_it_for_the_cores_libc_only():
    if not os.path.exists(LIBC):
        pytest.skip("no x86_64 glibc at " + LIBC)
    listed = subprocess.run(["readelf", "-W", "--dyn-syms", LIBC], capture_output=True, text=True).stdout
    [value] = [int(line.split()[1], 16) for line in listed.splitlines() if line.endswith(" __abort_msg@@GLIBC_PRIVATE")]
    report = {"files": {}}
    fd = os.open(LIBC, os.O_RDONLY | os.O_CLOEXEC)
    try:
        assert elffile.dynsym_value(fd, b"__abort_msg") == value
        assert elffile.dynsym_value(fd, b"no_such_symbol_here") is None
        jail._read_facts(report, LIBC, fd)
    finally:
        os.close(fd)
    facts = report["files"][LIBC]
    assert facts["abort_msg"] == value and facts["build_id"]
    libc = {"name": LIBC, "file": LIBC, "start": 0x7f0000000000, "build_id": facts["build_id"], "disk": facts}
    assert reason._abort_msg_value(libc) == value
    assert reason._abort_msg_value(dict(libc, build_id="00" * 20)) is None  # another build's file: not used
    assert reason._abort_msg_value({k: v for k, v in libc.items() if k != "disk"}) is None  # not vetted: nothing
    # Another library's facts carry no abort message, whatever its name says inside.
    other = {"files": {}}
    fd = os.open("/bin/true", os.O_RDONLY | os.O_CLOEXEC)
    try:
        jail._read_facts(other, "/bin/true", fd)
    finally:
        os.close(fd)
    assert "abort_msg" not in other["files"]["/bin/true"]


def test_dynsym_value_answers_nothing_for_what_is_not_an_elf_file(tmp_path):
    for data in (b"", b"\x7fELF", b"\x7fELF\x02\x01\x01" + b"\0" * 57, os.urandom(4096)):
        path = tmp_path / "x"
        path.write_bytes(data)
        fd = os.open(path, os.O_RDONLY)
        try:
            assert elffile.dynsym_value(fd, b"__abort_msg") is None
        finally:
            os.close(fd)
