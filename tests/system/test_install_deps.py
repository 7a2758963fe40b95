"""scripts/install-deps leaves the host's crash handler alone: a package's postinst that takes the handler (as
systemd-coredump's applies its sysctl.d file) is undone live, and its boot-time file is masked. apt-get and
dpkg-query are stand-ins here that do what the real ones did on a fresh machine; the sysctls are the host's,
borrowed (host_core_settings): the stand-in apt-get plays a foreign package's postinst, the one writer of
core_pattern here that is not host/handler.py, and the borrow puts back whatever it leaves."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from corehandler.host import sysctl

pytestmark = [pytest.mark.root, pytest.mark.live_kernel]

ROOT = Path(__file__).resolve().parents[2]
MASK = Path("/etc/sysctl.d/50-coredump.conf")
SYSTEMD_PATTERN = "|/lib/systemd/systemd-coredump %P %u %g %s %t 9223372036854775808 %h %d"


def stand_ins(bin_dir: Path, installed: Path) -> None:
    bin_dir.mkdir()
    (bin_dir / "dpkg-query").write_text(f"""#!/bin/sh
# -W -f=... NAME: installed only once the fake apt-get ran
pkg=$(eval echo \\${{$#}})
if [ -e {installed} ] || [ "$pkg" != systemd-coredump ] && [ "$pkg" != lintian ]; then
    printf 'install ok installed'
else
    exit 1
fi
""")
    # another party's: systemd-coredump's postinst as apt runs it, inside the test's borrow of the handler
    (bin_dir / "apt-get").write_text(f"""#!/bin/sh
[ "$1" = update ] && exit 0
touch {installed}
# what systemd-coredump's postinst does: /lib/systemd/systemd-sysctl /usr/lib/sysctl.d/50-coredump.conf
echo '{SYSTEMD_PATTERN}' > /proc/sys/kernel/core_pattern
echo 16 > /proc/sys/kernel/core_pipe_limit
""")
    for tool in ("dpkg-query", "apt-get"):
        (bin_dir / tool).chmod(0o755)


@pytest.fixture
def no_mask():
    """The test must see install-deps make the mask, but on a CI machine the run's own install-deps (which
    really installed systemd-coredump) made it already: it is set aside, byte for byte, and put back."""
    aside = MASK.with_name(".50-coredump.conf.test-aside")
    if os.path.lexists(aside):
        pytest.fail(f"{aside} is left from an interrupted run: move it back to {MASK} by hand")
    had = os.path.lexists(MASK)
    if had:
        os.rename(MASK, aside)
    try:
        yield
    finally:
        if MASK.is_symlink() and os.readlink(MASK) == "/dev/null":
            MASK.unlink()
        if had:
            os.rename(aside, MASK)


def test_installing_test_deps_keeps_the_live_handler(host_core_settings, no_mask, tmp_path):
    host_core_settings.point("|/bin/false install-deps-test %p", 3)
    stand_ins(tmp_path / "bin", tmp_path / "installed")
    result = subprocess.run([str(ROOT / "scripts" / "install-deps"), "test"], capture_output=True, text=True,
                            env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "installed").exists(), "the stand-in apt-get did not run"
    assert sysctl.read(sysctl.CORE_PATTERN) == "|/bin/false install-deps-test %p"
    assert sysctl.read(sysctl.CORE_PIPE_LIMIT) == "3"
    assert os.readlink(MASK) == "/dev/null"
