"""Upgrades as apt does them, in a fresh Debian root (support/debroot.py), never on this host: the previous
release's package (packaging/deb/previous-release) installed, configured and given dumps, then this tree's
package over it; a downgrade back; remove and purge. The previous release was one package with the fleet's
libraries in it; the upgrade to the host package alone (--no-install-recommends) keeps everything above, and
an upgrade from a repository as `apt full-upgrade` does it brings corehandler-fleet too (corehandler
recommends it), so an admin whose daemon uploaded keeps uploading.

In the root the package takes a real machine's path without systemd: postinst claims the handler (the root's
own kernel/core_pattern file) and starts the supervised daemon; prerm stops it. Dumps are captured as the
kernel would: the feeder pipes a core into the installed csplice with the kernel's arguments.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from support import cbuild, debroot
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.deb, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CSPLICE = "/usr/libexec/corehandler/csplice"
SUPERVISE = "/usr/lib/corehandler/bin/python3 -m corehandler.host.supervise"
LOG = "/var/log/corehandler/corehandler.log"
CONFFILE = "/etc/corehandler/corehandler.toml"
DROPIN = "/etc/corehandler/corehandler.d/50-local.toml"
# Feeds one crash into the installed csplice as the kernel does (core_pattern's arguments; a proc root where
# the pid is alive); the daemon, if running, ingests it.
FEED = r"""
set -e
pid=$1
mkdir -p /tmp/noproc/$pid
settings=/var/lib/corehandler/csplice.conf
CSPLICE_PROC_ROOT=/tmp/noproc CSPLICE_LOG_STDERR=1 /usr/local/bin/feeder --size $((2 << 20)) --pid $pid -- \
    /usr/libexec/corehandler/csplice $pid $pid $pid 0 0 1 11 $(date +%s) 18446744073709551615 root crashy$pid
"""
# dpkg runs this after each of its actions (--post-invoke): after the unpack, the old daemon has been stopped
# by the old prerm and the new postinst has not run yet: a crash then waits in the spool for the new daemon.
DURING = """#!/bin/sh
[ "$DPKG_HOOK_ACTION" = unpack ] && [ ! -e /tmp/during ] || exit 0
/usr/lib/corehandler/bin/python3 -m corehandler.host.supervise status >/dev/null 2>&1; echo $? > /tmp/during
sh /usr/local/bin/feed 7777 >/dev/null 2>&1
"""
APT = "apt-get -y -q --no-install-recommends -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"


def tree_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def deb_version(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True,
                          check=True).stdout.strip()


def newer(a: str, b: str) -> bool:
    return subprocess.run(["dpkg", "--compare-versions", a, "gt", b]).returncode == 0


def installed_version(root: debroot.Root) -> str:
    return root.run("dpkg-query -W -f='${db:Status-Status} ${Version}' corehandler", check=False).stdout


def dumps(root: debroot.Root) -> dict[str, str]:
    """id -> sha256 of every stored dump, as `corehandler dump` gives it back."""
    listed = json.loads(root.run("corehandler --json list").stdout or "[]")
    out = {}
    for entry in listed:
        ident = entry["id"]
        out[ident] = root.run(f"corehandler dump id={ident} | sha256sum").stdout.split()[0]
    return out


def starts(root: debroot.Root) -> int:
    log = root.path(LOG)
    return log.read_text().count("starting: ") if log.exists() else 0


@pytest.fixture(scope="module")
def versions(deb, previous_deb) -> tuple[str, str]:
    new, old = deb_version(deb), deb_version(previous_deb)
    if not os.environ.get("COREHANDLER_DEB"):  # a package given by name may be a candidate's, built elsewhere
        assert new == tree_version()
    if not newer(new, old):
        pytest.skip(f"this tree's version {new} is not newer than the previous release's {old} "
                    "(packaging/deb/previous-release): bump the version first")
    return old, new


def stage(root: debroot.Root, previous_deb: Path, deb: Path, debs: str = "/tmp/debs", during: str = DURING) -> None:
    """Both packages in debs/ of the root (previous.deb, new.deb), the feeder with `feed`, and dpkg's hook."""
    root.put(previous_deb, f"{debs}/previous.deb")
    root.put(deb, f"{debs}/new.deb")
    root.put(cbuild.feeder(), "/usr/local/bin/feeder")
    root.path("/usr/local/bin/feed").write_text(FEED)
    root.path("/usr/local/bin/during").write_text(during)
    root.path("/usr/local/bin/during").chmod(0o755)


@pytest.fixture(scope="module")
def root(bookworm_tarball, tmp_path_factory, deb, previous_deb):
    r = debroot.Root(bookworm_tarball, tmp_path_factory.mktemp("upgrade") / "root")
    try:
        stage(r, previous_deb, deb)
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def upgraded(root, versions) -> dict:
    """The previous release installed, configured, given three dumps; then this tree's package over it."""
    old, new = versions
    root.run(f"{APT} install /tmp/debs/previous.deb")
    assert installed_version(root) == f"installed {old}"
    pattern = root.sysctl("kernel/core_pattern")
    assert pattern.startswith(f"|{CSPLICE} "), pattern
    assert root.run(f"{SUPERVISE} status", check=False).returncode == 0
    # The admin's edits: the conffile changed in place, and a drop-in.
    conf = root.path(CONFFILE)
    conf.write_text(conf.read_text().replace("#level = 1", "level = 3", 1))
    root.path(DROPIN).write_text("[retention]\nmax_count = 1000\n")
    for pid in (4201, 4202, 4203):
        root.run(f"sh /usr/local/bin/feed {pid}")
    wait_for(lambda: len(dumps(root)) == 3, 120, "the previous release's daemon to store three dumps")
    before = {"dumps": dumps(root), "conf": conf.read_text(), "starts": starts(root),
              "sysctls": {name: root.sysctl(name) for name in debroot.KERNEL_FILES},
              "csplice.conf": root.path("/var/lib/corehandler/csplice.conf").read_text()}

    upgrade = root.run(f"{APT} -o Dpkg::Options::=--post-invoke=/usr/local/bin/during install /tmp/debs/new.deb")
    return {"before": before, "upgrade": upgrade, "old": old, "new": new}


def test_upgrade_installs_the_new_version_and_keeps_the_admins_edits(root, upgraded):
    assert installed_version(root) == f"installed {upgraded['new']}"
    # --no-install-recommends: the host package alone, and none of the old package's fleet libraries left.
    assert root.run("dpkg-query -W -f='${db:Status-Status}' corehandler-fleet", check=False).stdout != "installed"
    assert not list(root.path("/usr/lib/corehandler/lib").glob("python3*/site-packages/pyarrow"))
    assert root.path(CONFFILE).read_text() == upgraded["before"]["conf"]
    assert root.path(DROPIN).read_text() == "[retention]\nmax_count = 1000\n"
    shown = root.run("corehandler config show").stdout
    assert "level = 3" in shown and "max_count = 1000" in shown, shown


def test_upgrade_keeps_every_dump_byte_for_byte(root, upgraded):
    after = dumps(root)
    assert {k: after.get(k) for k in upgraded["before"]["dumps"]} == upgraded["before"]["dumps"]


def test_upgrade_keeps_the_kernels_settings(root, upgraded):
    assert {name: root.sysctl(name) for name in debroot.KERNEL_FILES} == upgraded["before"]["sysctls"]
    # Every setting the old csplice.conf had, with its value; the new version may add its own (0.5.0:
    # max_pending_per_uid), which the old csplice never read.
    def settings(text: str) -> dict[str, str]:
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    old = settings(upgraded["before"]["csplice.conf"])
    new = settings(root.path("/var/lib/corehandler/csplice.conf").read_text())
    assert {k: new.get(k) for k in old} == old


def test_upgrade_restarts_the_daemon_once_and_it_ingests_the_crash_spooled_meanwhile(root, upgraded):
    # The hook saw the daemon stopped (supervise status: not 0) while the crash went into the spool.
    assert root.path("/tmp/during").read_text().strip() not in ("", "0")
    assert starts(root) == upgraded["before"]["starts"] + 1
    assert root.run(f"{SUPERVISE} status", check=False).returncode == 0
    wait_for(lambda: len(dumps(root)) == len(upgraded["before"]["dumps"]) + 1, 120,
             "the crash spooled during the upgrade in the store")


def test_downgrade_is_refused_with_one_line_naming_both_versions(root, upgraded):
    old, new = upgraded["old"], upgraded["new"]
    result = root.run(f"{APT} --allow-downgrades install /tmp/debs/previous.deb", check=False)
    # apt passes dpkg's output, the maintainer scripts' included, on its standard output.
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "refusing to downgrade" in line]
    assert len(lines) == 1, result.stdout + result.stderr
    assert f"from {new} to {old}" in lines[0] and f"apt-get install corehandler={new}" in lines[0], lines
    # dpkg asks the older package's prerm next (failed-upgrade): one that refuses too keeps this version; an
    # older one (0.4.0) lets the downgrade go ahead, and the new package is put back here for what follows.
    prerm = subprocess.run(["dpkg-deb", "-I", str(root.path("/tmp/debs/previous.deb")), "prerm"],
                           capture_output=True, text=True).stdout
    if "refuse_downgrade" in prerm:
        assert result.returncode != 0 and installed_version(root) == f"installed {new}"
    else:
        root.run(f"{APT} install /tmp/debs/new.deb")
    assert installed_version(root) == f"installed {new}"


def test_remove_keeps_the_dumps_and_gives_the_kernel_back_then_purge_leaves_nothing(root, upgraded):
    """The handler the root had before the previous release was installed is the one given back: what 0.4.0
    saved survived the upgrade."""
    kept = dumps(root)
    root.run(f"{APT} remove corehandler")
    assert installed_version(root).startswith("config-files")
    assert {name: root.sysctl(name) for name in debroot.KERNEL_FILES} == debroot.KERNEL_FILES
    assert "corehandler serve" not in root.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout
    store = root.path("/var/lib/corehandler/store")
    assert all(any(p.name.startswith(ident) for p in store.rglob("*")) for ident in kept), kept
    root.run(f"{APT} purge corehandler")
    assert installed_version(root) == ""
    leftovers = [p for p in ("/var/lib/corehandler", "/var/log/corehandler", "/usr/lib/corehandler",
                             "/usr/libexec/corehandler", "/usr/bin/corehandler") if root.path(p).exists()]
    assert leftovers == []
    # Of /etc/corehandler only the admin's own drop-in is left (dpkg purges the package's conffiles only).
    etc = root.path("/etc/corehandler")
    assert sorted(str(p.relative_to(root.dir)) for p in etc.rglob("*") if p.is_file()) == [DROPIN.lstrip("/")]


def test_one_core_dump_handler_at_a_time_with_systemd_coredump(root, upgraded):
    """Provides/Conflicts/Replaces core-dump-handler, as systemd-coredump declares it: apt removes whichever
    is installed to install the other (never both), and each takes the kernel's pattern in turn. (After the
    purge above: the package installed afresh first.)"""
    root.run(f"{APT} install /tmp/debs/new.deb")
    root.run("apt-get -q update", timeout=600)
    took = root.run(f"{APT} install systemd-coredump", timeout=900)
    assert re.search(r"(?m)^The following packages will be REMOVED:\n\s+corehandler\b", took.stdout), took.stdout
    assert installed_version(root).startswith("config-files")
    assert root.run("dpkg-query -W -f='${db:Status-Status}' systemd-coredump").stdout == "installed"
    assert CSPLICE not in root.sysctl("kernel/core_pattern")
    back = root.run(f"{APT} install /tmp/debs/new.deb", timeout=900)
    assert re.search(r"(?m)^The following packages will be REMOVED:\n\s+systemd-coredump\b", back.stdout), back.stdout
    assert root.run("dpkg-query -W -f='${db:Status-Status}' systemd-coredump", check=False).stdout != "installed"
    assert installed_version(root) == f"installed {upgraded['new']}"
    assert root.sysctl("kernel/core_pattern").startswith(f"|{CSPLICE} ")
    assert root.run(f"{SUPERVISE} status", check=False).returncode == 0


UPLOAD = "/etc/corehandler/corehandler.d/60-upload.toml"


def test_an_admin_who_uploaded_gets_the_fleet_package_from_the_upgrade(bookworm_tarball, tmp_path, versions,
                                                                        debs, previous_deb):
    """The previous release (one package) uploading to a bucket, then this tree's packages from a repository
    (a file: source made of them) by `apt-get full-upgrade` with apt's default Recommends: corehandler-fleet
    comes with corehandler, and the new daemon takes the upload queue up (its attempts fail on an endpoint
    that refuses them: FAILING, not "corehandler-fleet is not installed")."""
    old, new = versions
    repo = tmp_path / "repo"
    repo.mkdir()
    for deb in debs.values():
        (repo / deb.name).write_bytes(deb.read_bytes())
    packages = subprocess.run(["dpkg-scanpackages", "--multiversion", "."], cwd=repo, capture_output=True,
                              text=True, check=True).stdout
    (repo / "Packages").write_text(packages)
    r = debroot.Root(bookworm_tarball, tmp_path / "root")
    try:
        for file in repo.iterdir():
            r.put(file, f"/srv/repo/{file.name}")
        r.put(previous_deb, "/tmp/previous.deb")
        r.put(cbuild.feeder(), "/usr/local/bin/feeder")
        r.path("/usr/local/bin/feed").write_text(FEED)
        r.run(f"{APT} install /tmp/previous.deb")
        r.path(UPLOAD).write_text('[upload]\nurl = "s3://fleet-bucket/hosts"\nendpoint = "http://127.0.0.1:9"\n')
        r.run(f"{SUPERVISE} reload")
        r.run("sh /usr/local/bin/feed 4301")
        # `list` exits 1 until there is a dump.
        wait_for(lambda: r.run("corehandler --json list", check=False).returncode == 0, 120,
                 "the previous release's daemon to store a dump")
        # Only the repository: the root's Debian lists are gone after mmdebstrap, nothing else is upgraded.
        r.path("/etc/apt/sources.list.d/corehandler.list").write_text("deb [trusted=yes] file:/srv/repo ./\n")
        r.run("apt-get -q update -o Dir::Etc::sourcelist=sources.list.d/corehandler.list "
              "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0")
        r.run("apt-get -y -q -o Dpkg::Options::=--force-confold full-upgrade")
        assert installed_version(r) == f"installed {new}"
        assert r.run("dpkg-query -W -f='${db:Status-Status} ${Version}' corehandler-fleet").stdout == \
            f"installed {new}"

        def upload_line() -> str:
            status = r.run("corehandler status", check=False).stdout
            return next((line for line in status.splitlines() if line.startswith("upload:")), "")

        wait_for(lambda: "FAILING" in upload_line(), 120, "the new daemon's upload attempt")
        assert "corehandler-fleet" not in upload_line()
        assert len(dumps(r)) == 1
    finally:
        r.close()
