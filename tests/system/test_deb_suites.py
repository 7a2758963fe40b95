"""Each Debian release's packages, installed in a fresh root of that release (support/debroot.py): Debian 12's
(built on this bookworm host) and Debian 13's (built in a trixie root, on trixie's python3). The host package
alone (--no-install-recommends) installs, captures and stores a crash, runs its daemon with uploads off although
[upload] names a bucket, and says so (status, log), and its fleet verbs name the package to install; adding
corehandler-fleet makes them work and the running daemon takes its uploads up on the reload the package's
postinst sends; removing it again restarts the daemon without it; purge leaves nothing. lintian pedantic finds
no error or warning in either release's .changes (both packages, the -dbgsym, the build). (The upgrade from
the previous release is test_deb_upgrade.py's.)"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from support import cbuild, debroot
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.deb, pytest.mark.slow]

SUITES = ("bookworm", "trixie")
PYTHON = "/usr/lib/corehandler/bin/python3"
SUPERVISE = f"{PYTHON} -m corehandler.host.supervise"
LOG = "/var/log/corehandler/corehandler.log"
APT = "apt-get -y -q --no-install-recommends"
FEED = ("mkdir -p /tmp/noproc/4301 && CSPLICE_PROC_ROOT=/tmp/noproc /usr/local/bin/feeder --size 2097152 "
        "--pid 4301 -- /usr/libexec/corehandler/csplice 4301 4301 4301 0 0 1 11 $(date +%s) "
        "18446744073709551615 root crashy4301")
# The admin's uploads, to a bucket whose endpoint refuses every connection: the daemon runs whatever it does.
UPLOAD = "/etc/corehandler/corehandler.d/60-upload.toml"
UPLOAD_TOML = '[upload]\nurl = "s3://fleet-bucket/hosts"\nendpoint = "http://127.0.0.1:9"\n'
FLEET_MODULES = ("boto3", "botocore", "pyarrow", "duckdb", "pyrage")


def field(deb, name: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture(params=SUITES)
def suite(request) -> str:
    return request.param


@pytest.fixture
def built(suite, request) -> dict:
    return request.getfixturevalue("debs" if suite == "bookworm" else "trixie_debs")


@pytest.fixture
def suite_root(suite, request, tmp_path):
    root = debroot.Root(request.getfixturevalue(f"{suite}_tarball"), tmp_path / "root")
    try:
        yield root
    finally:
        root.close()


def upload_line(root: debroot.Root) -> str:
    status = root.run("corehandler status", check=False).stdout
    return next((line for line in status.splitlines() if line.startswith("upload:")), "")


def imported_at_start(root: debroot.Root, verb: str) -> set[str]:
    """The fleet's top-level modules a CLI verb imports (python -X importtime), run where the fleet is installed."""
    trace = root.run(f"{PYTHON} -X importtime -m corehandler {verb} 2>&1 >/dev/null", check=False).stdout
    return {m for m in FLEET_MODULES if re.search(rf"\|\s+{m}(\.|$)", trace, re.M)}


def test_the_host_package_alone_then_with_the_fleet_package(suite, built, suite_root):
    root = suite_root
    host, fleet = built["corehandler"], built["corehandler-fleet"]
    version = field(host, "Version")
    python = root.run("readlink -f /usr/bin/python3").stdout.strip()
    # Built for the release's own python3.X, and the fleet's for exactly this build of corehandler.
    assert python.startswith("/usr/bin/python3.") and field(host, "Depends").startswith(python.rsplit("/", 1)[1] + ",")
    assert python != "/usr/bin/python3.11" if suite == "trixie" else python == "/usr/bin/python3.11"
    assert f"corehandler (= {version})" in field(fleet, "Depends")
    assert "corehandler-fleet" in field(host, "Recommends")
    root.put(host, "/tmp/corehandler.deb")
    root.put(fleet, "/tmp/corehandler-fleet.deb")
    root.put(cbuild.feeder(), "/usr/local/bin/feeder")
    root.path(UPLOAD).parent.mkdir(parents=True)
    root.path(UPLOAD).write_text(UPLOAD_TOML)

    # -- the host package alone ----------------------------------------------------------------------------
    root.run(f"{APT} install /tmp/corehandler.deb")
    assert root.run("dpkg-query -W -f='${db:Status-Status}' corehandler-fleet", check=False).stdout != "installed"
    assert root.run("corehandler --version").stdout.strip() == f"corehandler {version}"
    shipped = root.run("dpkg -L corehandler").stdout
    assert not [m for m in FLEET_MODULES if f"/site-packages/{m}/" in shipped]
    assert root.sysctl("kernel/core_pattern").startswith("|/usr/libexec/corehandler/csplice ")
    assert root.run(f"{SUPERVISE} status", check=False).returncode == 0
    root.run(FEED)

    def listed():
        return json.loads(root.run("corehandler --json list", check=False).stdout or "[]")

    wait_for(lambda: len(listed()) == 1, 120, f"the crash stored by {suite}'s daemon")
    # Uploads are off, and both the daemon's log and status say why and what to install.
    assert "OFF: corehandler-fleet is not installed" in upload_line(root), upload_line(root)
    wait_for(lambda: "Uploads are off although [upload] url is set: corehandler-fleet is not installed"
             in root.path(LOG).read_text(), 60, "the daemon's line about uploads")
    refused = root.run("corehandler fleet list", check=False)
    assert refused.returncode == 5 and refused.stderr.count("\n") == 1, refused
    assert "install corehandler-fleet" in refused.stderr

    # -- corehandler-fleet added -----------------------------------------------------------------------------
    daemon = root.run(f"{SUPERVISE} status").stdout
    root.run(f"{APT} install /tmp/corehandler-fleet.deb")
    probe = "import duckdb, pyarrow, boto3, pyrage; print(duckdb.sql('SELECT 42').fetchall())"
    assert root.run(f"{PYTHON} -c \"{probe}\"").stdout.strip() == "[(42,)]"
    tried = root.run("corehandler fleet list", check=False)
    # It reaches for the bucket now: refused by the endpoint, not for a missing package.
    assert tried.returncode not in (0, 5) and "corehandler-fleet" not in tried.stderr, tried
    # The same daemon (reloaded, not restarted) takes the queue up: its attempt fails on the endpoint.
    wait_for(lambda: "FAILING" in upload_line(root), 120, "the reloaded daemon's first upload attempt")
    assert "corehandler-fleet" not in upload_line(root)
    assert root.run(f"{SUPERVISE} status").stdout == daemon
    # The host's verbs load none of the fleet's libraries, also where they are installed.
    assert imported_at_start(root, "--json list") == set()
    assert imported_at_start(root, "status") == set()

    # -- corehandler-fleet removed: the daemon is restarted without it ---------------------------------------
    starts = root.path(LOG).read_text().count("starting: ")
    root.run(f"{APT} remove corehandler-fleet")
    assert root.path(LOG).read_text().count("starting: ") == starts + 1
    assert root.run(f"{SUPERVISE} status", check=False).returncode == 0
    assert root.run("corehandler fleet list", check=False).returncode == 5
    assert not root.path("/usr/lib/corehandler/fleet").exists()

    # -- purge ------------------------------------------------------------------------------------------------
    root.path(UPLOAD).unlink()
    root.run(f"{APT} purge corehandler")
    assert root.sysctl("kernel/core_pattern") == "core"
    assert not root.path("/var/lib/corehandler").exists() and not root.path("/usr/lib/corehandler").exists()


def test_lintian_finds_no_errors_or_warnings(suite, built):
    """On each release's .changes: corehandler, corehandler-fleet, the -dbgsym and the build."""
    (changes,) = built["corehandler"].parent.glob("corehandler_*.changes")
    listed = changes.read_text()
    assert "corehandler-fleet_" in listed and "corehandler-dbgsym_" in listed
    result = subprocess.run(["lintian", "--pedantic", "--fail-on", "warning", str(changes)], capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not re.search(r"^[EW]: ", result.stdout, re.M), result.stdout
