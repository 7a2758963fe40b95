"""sysctl: reading live values under an injected root and our sysctl.d file; the host lock. (The writes are
host/handler.py's: test_handler.py.)"""

from __future__ import annotations

import os
import stat

import pytest

from corehandler.errors import SystemFailure
from corehandler.host import sysctl


@pytest.fixture
def root(tmp_path):
    (tmp_path / "kernel").mkdir()
    (tmp_path / "kernel/core_pattern").write_text("core\n")  # not the host's: a fake tree under tmp_path
    (tmp_path / "kernel/core_pipe_limit").write_text("0\n")  # not the host's: a fake tree under tmp_path
    return tmp_path


def test_read(root):
    assert sysctl.read(sysctl.CORE_PATTERN, root) == "core"
    # not the host's: a fake kernel's tree, under tmp_path
    (root / "kernel/core_pattern").write_text("|/x/csplice %P  \n")
    assert sysctl.read(sysctl.CORE_PATTERN, root) == "|/x/csplice %P  "
    with pytest.raises(SystemFailure, match=r"cannot read kernel.nope .*No such file"):
        sysctl.read("kernel.nope", root)


def test_sysctl_d_file_is_read_as_systemd_sysctl_reads_it(tmp_path):
    d = tmp_path / "sysctl.d"
    assert sysctl.read_sysctl_d(d) is None
    d.mkdir()
    # not the host's: a fake tree under tmp_path
    (d / sysctl.SYSCTL_D_NAME).write_text("# comment\n; also\nkernel.core_pattern = |/x/csplice %P %i\n"
                                          "kernel.core_pipe_limit=16\n\n")
    assert sysctl.read_sysctl_d(d) == {sysctl.CORE_PATTERN: "|/x/csplice %P %i", sysctl.CORE_PIPE_LIMIT: "16"}


def test_our_file_sorts_after_systemd_coredump():
    assert sorted(["50-coredump.conf", sysctl.SYSCTL_D_NAME])[-1] == sysctl.SYSCTL_D_NAME


def test_the_core_pattern_lock_is_held_in_a_directory_of_ours_alone(tmp_path):
    """Not world-writable /run/lock: there a user could hold the lock (hanging doctor --probe) or plant a
    symlink. The lock's directory is made ours and 0700; a lock file is never followed through a symlink."""
    assert not str(sysctl.CORE_PATTERN_LOCK).startswith("/run/lock/")
    lock = tmp_path / "run" / "lock" / "core-pattern.lock"
    with sysctl.held_lock(lock):
        assert stat.S_IMODE(lock.parent.stat().st_mode) == 0o700 and stat.S_IMODE(lock.stat().st_mode) == 0o600
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    lock.unlink()
    lock.symlink_to(victim)
    with pytest.raises(SystemFailure, match="cannot open the lock"):
        with sysctl.held_lock(lock):
            pass
    assert victim.read_text() == "untouched"


@pytest.mark.parametrize("plant", ["open to others", "symlinked"])
def test_a_lock_directory_someone_else_could_write_is_refused(tmp_path, plant):
    (tmp_path / "run").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o777)
    os.chmod(elsewhere, 0o777)
    if plant == "symlinked":
        os.chmod(elsewhere, 0o700)
        (tmp_path / "run" / "lock").symlink_to(elsewhere)
    else:
        elsewhere.rename(tmp_path / "run" / "lock")
    with pytest.raises(SystemFailure):
        with sysctl.held_lock(tmp_path / "run" / "lock" / "core-pattern.lock"):
            pass
