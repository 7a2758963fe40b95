"""`why`'s rules on given facts (host/coreready.py, host/procfacts.py): the host's handler in each state, the
kernel's coredump_filter rules over smaps, RLIMIT_CORE from /proc/PID/limits. Real processes:
tests/local/test_why.py."""

from __future__ import annotations

import pytest

from corehandler.host import coreready, procfacts
from corehandler.host.coreready import CUTS, OK, STOPS, HostState


def state(**kw) -> HostState:
    base = dict(pattern="|/usr/libexec/corehandler/csplice %P", pipe_limit="16", suid_dumpable=0, mode="pipe",
                owner="/var/lib/corehandler", this=True, displaced=False, listening=None,
                socket_path="/run/corehandler/coredump.socket", settings={}, settings_from="test")
    return HostState(**{**base, **kw})


@pytest.mark.parametrize("kw, verdicts, words", [
    ({}, [OK, OK], "this installation"),
    ({"this": False, "owner": "/srv/other"}, [OK, OK], "the installation in /srv/other"),
    ({"pattern": "core", "mode": None}, [STOPS], "writes a core file itself"),
    ({"pattern": "|/lib/systemd/systemd-coredump %P", "mode": None}, [STOPS, OK], "runs /lib/systemd/systemd-coredump"),
    ({"pattern": "|/lib/systemd/systemd-coredump %P", "mode": None, "displaced": True}, [STOPS, OK],
     "took the pattern over"),
    ({"pattern": "@@/run/corehandler/coredump.socket", "mode": "socket", "listening": False}, [OK, STOPS],
     "nothing listens"),
    ({"pipe_limit": "0"}, [OK, OK], "may find /proc/PID gone"),
])
def test_host_checks(kw, verdicts, words):
    checks = coreready.host_checks(state(**kw))
    assert [c.verdict for c in checks] == verdicts
    assert words in " ".join(c.detail for c in checks)
    assert all((c.fix is None) == (c.verdict == OK) for c in checks)
    assert coreready.full_core(checks) == (STOPS not in verdicts)


SMAPS = """\
55d0c0000000-55d0c0001000 r--p 00000000 fe:00 1234 /usr/bin/prog
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd mr mw me sd
55d0c0001000-55d0c0003000 rw-p 00001000 fe:00 1234 /usr/bin/prog
Anonymous:             4 kB
Swap:                  0 kB
VmFlags: rd wr mr mw me ac sd
7f0000000000-7f0000100000 rw-p 00000000 00:00 0
Anonymous:           512 kB
Swap:                  0 kB
VmFlags: rd wr mr mw me ac sd
7f0000100000-7f0000200000 rw-p 00000000 00:00 0
Anonymous:           256 kB
Swap:                  0 kB
VmFlags: rd wr mr mw me ac sd dd
7f0000200000-7f0000400000 rw-s 00000000 00:01 99 /memfd:buf (deleted)
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd wr sh mr mw me ms sd
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]
Anonymous:             0 kB
Swap:                  0 kB
VmFlags: rd ex mr mw me de sd
"""


@pytest.mark.parametrize("filt, size", [
    # ELF header page of the file + its written .data (anon_vma) + the anonymous 1 MiB + the memfd + the vdso;
    # the MADV_DONTDUMP mapping never.
    (0x33, 4096 + 0x2000 + (1 << 20) + (2 << 20) + 0x2000),
    (0x00, 0x2000),                                        # the vdso alone
    (0x01, 0x2000 + (1 << 20) + 0x2000),                   # written private memory, not the memfd or headers
    (0x37, 0x1000 + 0x2000 + (1 << 20) + (2 << 20) + 0x2000),  # file-backed private whole
])
def test_dump_size_follows_the_kernel(filt, size):
    assert procfacts.dump_size(SMAPS, filt) == size


def test_limits_and_rlimit_verdicts():
    text = ("Limit                     Soft Limit           Hard Limit           Units\n"
            "Max core file size        0                    unlimited            bytes\n")
    assert procfacts.parse_limits(text) == (0, None)
    assert coreready.rlimit_check(0, True, 1 << 20, "a.service").verdict == STOPS
    assert "LimitCORE= of a.service" in coreready.rlimit_check(0, True, None, "a.service").detail
    assert coreready.rlimit_check(4096, True, 1 << 20, None).verdict == CUTS
    assert coreready.rlimit_check(None, True, 1 << 20, None).verdict == OK
