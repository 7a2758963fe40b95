"""sysctl: live values under an injected root and our sysctl.d file."""

from __future__ import annotations

import os
import stat

import pytest

from corehandler.errors import SystemFailure
from corehandler.host import sysctl


@pytest.fixture
def root(tmp_path):
    (tmp_path / "kernel").mkdir()
    (tmp_path / "kernel/core_pattern").write_text("core\n")
    (tmp_path / "kernel/core_pipe_limit").write_text("0\n")
    return tmp_path


def test_read_and_write(root):
    assert sysctl.read(sysctl.CORE_PATTERN, root) == "core"
    sysctl.write(sysctl.CORE_PATTERN, "|/x/csplice %P  ", root)
    assert (root / "kernel/core_pattern").read_text() == "|/x/csplice %P  \n"
    assert sysctl.read(sysctl.CORE_PATTERN, root) == "|/x/csplice %P  "


def test_errors_name_the_setting(root):
    with pytest.raises(SystemFailure, match=r"cannot read kernel.nope .*No such file"):
        sysctl.read("kernel.nope", root)
    with pytest.raises(SystemFailure, match=r"cannot set kernel.nope to '1'"):
        sysctl.write("kernel.nope", "1", root)
    with pytest.raises(ValueError):
        sysctl.write(sysctl.CORE_PATTERN, "a\nb", root)


def test_write_reads_back(root, tmp_path):
    # A value the "kernel" does not keep as written (here: a file replaced by a pipe-less symlink to /dev/null).
    target = root / "kernel/core_pipe_limit"
    target.unlink()
    target.symlink_to("/dev/null")
    with pytest.raises(SystemFailure, match="was set to '16' but the kernel reports ''"):
        sysctl.write(sysctl.CORE_PIPE_LIMIT, "16", root)


def test_sysctl_d_file(tmp_path):
    d = tmp_path / "sysctl.d"
    assert sysctl.read_sysctl_d(d) is None
    assert sysctl.remove_sysctl_d(d) is False
    values = {sysctl.CORE_PATTERN: "|/usr/libexec/corehandler/csplice %P %i", sysctl.CORE_PIPE_LIMIT: "16"}
    path = sysctl.write_sysctl_d(values, d)
    assert path == d / "50-corehandler.conf"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    text = path.read_text()
    assert "kernel.core_pattern = |/usr/libexec/corehandler/csplice %P %i\n" in text
    assert "kernel.core_pipe_limit = 16\n" in text
    assert sysctl.read_sysctl_d(d) == values
    assert sysctl.remove_sysctl_d(d) is True
    assert not path.exists()


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
