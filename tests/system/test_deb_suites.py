"""The package of each Debian release, installed in a fresh root of that release (support/debroot.py): Debian
13's, built in a trixie root, depends on trixie's python3 and runs there: a crash captured by its csplice is
stored and listed, then remove and purge. (Debian 12's is test_deb_upgrade.py's.)"""

from __future__ import annotations

import json
import subprocess

import pytest

from support import cbuild, debroot
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.deb, pytest.mark.slow]

FEED = ("mkdir -p /tmp/noproc/4301 && CSPLICE_PROC_ROOT=/tmp/noproc /usr/local/bin/feeder --size 2097152 "
        "--pid 4301 -- /usr/libexec/corehandler/csplice 4301 4301 4301 0 0 1 11 $(date +%s) "
        "18446744073709551615 root crashy4301")


@pytest.fixture
def trixie_root(trixie_tarball, tmp_path):
    root = debroot.Root(trixie_tarball, tmp_path / "root")
    try:
        yield root
    finally:
        root.close()


def test_the_trixie_package_installs_captures_and_purges_in_trixie(trixie_root, trixie_deb):
    root = trixie_root
    python = root.run("readlink -f /usr/bin/python3").stdout.strip()
    depends = subprocess.run(["dpkg-deb", "-f", str(trixie_deb), "Depends"], capture_output=True, text=True,
                             check=True).stdout
    assert python.startswith("/usr/bin/python3.") and python != "/usr/bin/python3.11"
    assert depends.startswith(python.rsplit("/", 1)[1] + ","), depends
    root.put(trixie_deb, "/tmp/corehandler.deb")
    root.put(cbuild.feeder(), "/usr/local/bin/feeder")
    root.run("apt-get -y -q --no-install-recommends install /tmp/corehandler.deb")
    version = subprocess.run(["dpkg-deb", "-f", str(trixie_deb), "Version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    assert root.run("corehandler --version").stdout.strip() == f"corehandler {version}"
    assert root.sysctl("kernel/core_pattern").startswith("|/usr/libexec/corehandler/csplice ")
    root.run(FEED)

    def listed():
        return json.loads(root.run("corehandler --json list", check=False).stdout or "[]")

    wait_for(lambda: len(listed()) == 1, 120, "the crash stored by trixie's daemon")
    root.run("apt-get -y -q purge corehandler")
    assert root.sysctl("kernel/core_pattern") == "core"
    assert not root.path("/var/lib/corehandler").exists() and not root.path("/usr/lib/corehandler").exists()


def test_lintian_finds_no_errors_or_warnings_in_the_trixie_package(trixie_deb):
    (changes,) = trixie_deb.parent.glob("corehandler_*.changes")
    result = subprocess.run(["lintian", "--pedantic", "--fail-on", "warning", str(changes)], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
