"""glibc's abort message: where its address is looked up (corehandler/analysis/reason.py), against the host's
libc and readelf."""

import pytest

from corehandler import elfcore
from corehandler.analysis import reason


def test_abort_msg_is_looked_up_only_in_a_root_owned_libc_of_the_cores_build_id(tmp_path):
    """libc's own file gives __abort_msg's value (as readelf reads it); a copy another user owns, or a file of
    another build-id, is never parsed as root."""
    import os
    import shutil
    import subprocess
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    if not os.path.exists(libc) or os.stat(libc).st_uid != 0:
        pytest.skip("no root-owned x86_64 glibc here")
    build_id = elfcore.file_build_id(libc)
    listed = subprocess.run(["readelf", "-W", "--dyn-syms", libc], capture_output=True, text=True).stdout
    [value] = [int(line.split()[1], 16) for line in listed.splitlines() if line.endswith(" __abort_msg@@GLIBC_PRIVATE")]
    reason._CACHE.clear()
    assert reason._abort_msg_symbol(os.path.realpath(libc), build_id) == value
    reason._CACHE.clear()
    copy = tmp_path / "libc.so.6"
    shutil.copyfile(libc, copy)
    if os.geteuid() == 0:
        os.chown(copy, 65534, 65534)
        assert reason._abort_msg_symbol(str(copy), build_id) is None  # a user's file: not read
        os.chown(copy, 0, 0)
    copy.chmod(0o666)
    assert reason._abort_msg_symbol(str(copy), build_id) is None  # writable by others: not read
    copy.chmod(0o644)
    assert reason._abort_msg_symbol(str(copy), "00" * 20) is None  # another build: not read
    assert reason._abort_msg_symbol("/proc/self/exe", build_id) is None
