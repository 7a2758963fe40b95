"""The maintainer scripts' own rules, run as dpkg runs them but without installing anything: prerm refuses a
downgrade in one line naming both versions and the way back, in both calls dpkg makes (the installed package's
`upgrade OLDER`, then the older package's `failed-upgrade NEWER`), and lets upgrades and reinstalls through.
The control file declares one core dump handler at a time. (tests/system/test_deb_upgrade.py runs them in a
Debian root through apt.)"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("dpkg") is None, reason="the maintainer scripts compare with dpkg")


def prerm(tmp_path: Path, version: str, *args: str) -> subprocess.CompletedProcess:
    """debian/corehandler.prerm as built for `version` (debian/rules fills it in), its stopping of the daemon
    cut off: only the version rule runs."""
    text = (ROOT / "debian/corehandler.prerm").read_text().replace("#VERSION#", version)
    text = text[:text.index('case "$1" in\n\tremove|upgrade')] + "exit 0\n"
    script = tmp_path / "prerm"
    script.write_text(text)
    return subprocess.run(["sh", str(script), *args], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("installed, call, other", [
    ("0.5.0", "upgrade", "0.4.0"),          # the installed package asked first
    ("0.4.1", "failed-upgrade", "0.5.0"),   # then the older one being installed
    ("0.5.0", "upgrade", "0.5.0~rc.1"),     # a pre-release sorts before its release
])
def test_prerm_refuses_a_downgrade_in_one_line(tmp_path, installed, call, other):
    result = prerm(tmp_path, installed, call, other)
    newer, older = (installed, other) if call == "upgrade" else (other, installed)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"refusing to downgrade from {newer} to {older}" in result.stderr
    assert f"apt-get install corehandler={newer}" in result.stderr


@pytest.mark.parametrize("installed, call, other", [
    ("0.4.0", "upgrade", "0.5.0"), ("0.5.0", "upgrade", "0.5.0"),  # upgrade, reinstall
    ("0.5.0", "failed-upgrade", "0.4.0"), ("0.5.0", "remove", ""), ("0.5.0", "deconfigure", ""),
])
def test_prerm_lets_upgrades_reinstalls_and_removals_through(tmp_path, installed, call, other):
    result = prerm(tmp_path, installed, call, *([other] if other else []))
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_the_package_is_one_core_dump_handler_among_its_alternatives():
    """As systemd-coredump and apport declare it: apt removes one to install another."""
    control = (ROOT / "debian/control").read_text()
    for field in ("Provides", "Conflicts", "Replaces"):
        assert re.search(rf"^{field}: core-dump-handler$", control, re.MULTILINE), field


def test_the_analysers_user_comes_from_sysusers_not_from_useradd():
    """Debian's way (dh_installsysusers, systemd-sysusers): no useradd, hence no passwd, in postinst."""
    sysusers = (ROOT / "debian/corehandler.sysusers").read_text()
    assert re.search(r"^u corehandler-analysis - ", sysusers, re.MULTILINE)
    postinst = (ROOT / "debian/corehandler.postinst").read_text()
    assert "systemd-sysusers" in postinst and "account.ensure" not in postinst and "useradd" not in postinst
