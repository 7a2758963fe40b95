"""The upgrade, remove and purge of test_deb_upgrade.py, on a machine where systemd is PID 1: a fresh bookworm root
booted by systemd-nspawn (support/bootedroot.py), never this host. There the maintainer scripts hand the daemon to
corehandler.service (deb-systemd-helper, deb-systemd-invoke) instead of the supervisor, and the upgrade's stop and
start are systemd's jobs, counted from its journal.
"""

from __future__ import annotations

import json
import shutil

import pytest
from test_deb_upgrade import APT, DURING, dumps, installed_version, stage, versions  # noqa: F401 (a fixture)

from support import bootedroot, debroot
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.deb, pytest.mark.slow]

CSPLICE = "/usr/libexec/corehandler/csplice"
UNIT = "corehandler.service"
# systemd's "unit started" message (catalog: a start job finished).
STARTED = "MESSAGE_ID=39f53479d3a045ac8e11786248231fbf"
# The hook of test_deb_upgrade.py, asking systemd instead of the supervisor whether the daemon runs (in /var/tmp:
# systemd mounts a tmpfs on the root's /tmp).
DURING_SYSTEMD = DURING.replace(
    "/usr/lib/corehandler/bin/python3 -m corehandler.host.supervise status >/dev/null 2>&1; echo $? > /tmp/during",
    f"systemctl is-active {UNIT} > /tmp/during").replace("/tmp/during", "/var/tmp/during")
DEBS = "/var/tmp/debs"


def starts(root: bootedroot.BootedRoot) -> int:
    return len(root.run(f"journalctl --no-pager -o cat _PID=1 UNIT={UNIT} {STARTED}", check=False)
               .stdout.splitlines())


def state(root: bootedroot.BootedRoot, prop: str) -> str:
    return root.run(f"systemctl show -p {prop} --value {UNIT}", check=False).stdout.strip()


@pytest.fixture(scope="module")
def booted(tmp_path_factory, deb, previous_deb):
    if shutil.which("systemd-nspawn") is None:
        pytest.fail("systemd-nspawn is not installed (scripts/apt/test.txt lists systemd-container)")
    out = tmp_path_factory.mktemp("booted")
    root = bootedroot.BootedRoot(bootedroot.make_tarball("bookworm", out), out / "root")
    try:
        stage(root, previous_deb, deb, DEBS, DURING_SYSTEMD)
        yield root
    finally:
        root.close()


@pytest.fixture(scope="module")
def upgraded(booted, versions) -> dict:  # noqa: F811
    old, new = versions
    booted.run(f"{APT} install {DEBS}/previous.deb")
    assert installed_version(booted) == f"installed {old}"
    assert state(booted, "ActiveState") == "active" and state(booted, "UnitFileState") == "enabled"
    # systemd runs the daemon: no supervisor beside it.
    assert "corehandler.host.supervise" not in booted.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout
    for pid in (4201, 4202):
        booted.run(f"sh /usr/local/bin/feed {pid}")
    wait_for(lambda: len(dumps(booted)) == 2, 120, "the previous release's daemon to store two dumps")
    before = {"dumps": dumps(booted), "starts": starts(booted), "main_pid": state(booted, "MainPID"),
              "sysctls": {name: booted.sysctl(name) for name in debroot.KERNEL_FILES}}
    assert before["starts"] == 1
    booted.run(f"{APT} -o Dpkg::Options::=--post-invoke=/usr/local/bin/during install {DEBS}/new.deb")
    return {"before": before, "old": old, "new": new}


def test_upgrade_stops_the_unit_before_the_new_files_and_starts_it_once_after(booted, upgraded):
    assert installed_version(booted) == f"installed {upgraded['new']}"
    # The old daemon was not running while the new release's files were unpacked under it.
    assert booted.path("/var/tmp/during").read_text().strip() != "active"
    assert starts(booted) == upgraded["before"]["starts"] + 1
    assert state(booted, "ActiveState") == "active" and state(booted, "NRestarts") == "0"
    assert state(booted, "MainPID") != upgraded["before"]["main_pid"]


def test_upgrade_keeps_the_dumps_and_ingests_the_crash_spooled_meanwhile(booted, upgraded):
    wait_for(lambda: len(dumps(booted)) == len(upgraded["before"]["dumps"]) + 1, 120,
             "the crash spooled during the upgrade in the store")
    after = dumps(booted)
    assert {k: after.get(k) for k in upgraded["before"]["dumps"]} == upgraded["before"]["dumps"]


def test_upgrade_keeps_the_kernels_settings(booted, upgraded):
    assert {name: booted.sysctl(name) for name in debroot.KERNEL_FILES} == upgraded["before"]["sysctls"]
    assert booted.sysctl("kernel/core_pattern").startswith(f"|{CSPLICE} ")


def test_why_names_a_units_limitcore_as_what_stops_its_core(booted, upgraded):
    """`corehandler why UNIT` asks the root's systemd: a unit with LimitCORE=0 is named by it and by its process's
    RLIMIT_CORE, with the fix; by the process's pid, the unit is found from its cgroup."""
    unit = "nocore.service"
    booted.path(f"/etc/systemd/system/{unit}").write_text("[Service]\nExecStart=/bin/sleep 600\nLimitCORE=0\n")
    booted.run(f"systemctl daemon-reload && systemctl start {unit}")
    try:
        result = booted.run(f"corehandler --json why {unit}", check=False)
        assert result.returncode == 1, result.stdout + result.stderr
        got = json.loads(result.stdout)
        assert got["kind"] == "unit" and got["name"] == unit
        [entry] = got["processes"]
        found = {c["name"]: c for c in entry["checks"]}
        assert {n for n, c in found.items() if c["verdict"] == "stops"} == {"rlimit_core", "unit_limit_core"}
        assert f"{unit} has LimitCORE=0" in found["unit_limit_core"]["detail"]
        assert f"systemctl edit {unit}" in found["rlimit_core"]["fix"]
        by_pid = booted.run(f"corehandler --json why {entry['pid']}", check=False)
        assert by_pid.returncode == 1
        [process] = json.loads(by_pid.stdout)["processes"]
        assert {c["name"]: c for c in process["checks"]}["unit_limit_core"]["verdict"] == "stops"
    finally:
        booted.run(f"systemctl stop {unit}", check=False)


def test_remove_stops_the_unit_and_gives_the_kernel_back_then_purge_leaves_no_unit(booted, upgraded):
    booted.run(f"{APT} remove corehandler")
    assert state(booted, "ActiveState") == "inactive"
    assert {name: booted.sysctl(name) for name in debroot.KERNEL_FILES} == debroot.KERNEL_FILES
    booted.run(f"{APT} purge corehandler")
    assert installed_version(booted) == ""
    assert state(booted, "LoadState") == "not-found"
    assert not booted.path("/etc/systemd/system/multi-user.target.wants/corehandler.service").exists()
