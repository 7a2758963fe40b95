"""The Debian package, end to end on this host: build it from the tree, `apt-get install` it, crash a real
process into it, `apt-get remove` (dumps kept), `apt-get purge` (nothing left), with the kernel's previous
core handler given back exactly.

This host has no systemd as PID 1, so the package runs the daemon through corehandler.host.supervise: that is the
path under test here. The unit file is checked as installed with systemd-analyze.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

from corehandler.csplice_contract import SPECIFIERS
from corehandler.errors import EXIT_CONFLICT
from corehandler.paths import DIR_MODES
from support import host_aside
from support.crash import build_crasher, crash
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.deb, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PYTHON = "/usr/lib/corehandler/bin/python3"
CSPLICE = "/usr/libexec/corehandler/csplice"
STATE = Path("/var/lib/corehandler")
LOGS = Path("/var/log/corehandler")
RUN = Path("/run/corehandler")
SUPERVISOR_LOG = LOGS / "corehandler.log"
# Stands for systemd-coredump or apport: a handler that was there first, which the package replaces and
# must give back exactly, with a pipe limit of its own.
FOREIGN = {"kernel/core_pattern": "|/bin/false corehandler-package-test %p", "kernel/core_pipe_limit": "3"}
# Anything of these found before the test is someone's (another test, an admin): moved aside and back.
PRESERVED = (STATE, LOGS, Path("/etc/corehandler"), Path("/etc/sysctl.d/50-corehandler.conf"))


def run(*cmd: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if cmd[0] == "apt-get":  # on a shared machine someone else's apt-get may hold dpkg's lock for a while
        cmd = (cmd[0], "-o", "DPkg::Lock::Timeout=300", *cmd[1:])
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def sysctl(name: str) -> str:
    return Path("/proc/sys", name).read_text().removesuffix("\n")


def package_state(package: str = "corehandler") -> str:
    result = run("dpkg-query", "-W", "-f=${db:Status-Status}", package, check=False)
    return result.stdout if result.returncode == 0 else "not-installed"


def supervisor(verb: str) -> subprocess.CompletedProcess:
    return run(PYTHON, "-m", "corehandler.host.supervise", verb, check=False, timeout=60)


@pytest.fixture
def clean_host(host_core_settings):
    """No corehandler package, no state of anyone else's in the way; both put back afterwards."""
    if package_state() != "not-installed":
        pytest.fail(f"the corehandler package is already on this host ({package_state()}): "
                    "`apt-get purge corehandler` first")
    # The host's own supervised daemon (scripts/setup's) shares /run/corehandler with the package's.
    with host_aside.host_daemon_stopped(), host_aside.paths_aside(PRESERVED, "package-test"):
        host_core_settings.point(FOREIGN["kernel/core_pattern"], FOREIGN["kernel/core_pipe_limit"])
        try:
            yield
        finally:
            if package_state() != "not-installed":
                run("apt-get", "purge", "-y", "-q", "corehandler", check=False)


def test_lintian_finds_no_errors_or_warnings(deb):
    """Every warning fixed or overridden with its reason in debian/corehandler.lintian-overrides: on the
    .changes, so the -dbgsym package too."""
    if shutil.which("lintian") is None:
        pytest.fail("lintian is not installed (scripts/apt/test.txt lists it)")
    (changes,) = deb.parent.glob("corehandler_*.changes")
    result = run("lintian", "--pedantic", "--fail-on", "warning", str(changes), check=False, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not re.search(r"^[EW]: ", result.stdout, re.M), result.stdout


def test_the_socket_unit_is_neither_enabled_nor_started_by_the_package(deb, tmp_path):
    """Socket mode is opt-in (`corehandler install --mode socket`): the maintainer scripts enable and start
    the daemon's unit only."""
    run("dpkg-deb", "-e", str(deb), str(tmp_path / "control"))
    postinst = (tmp_path / "control" / "postinst").read_text()
    assert "deb-systemd-helper enable 'corehandler.service'" in postinst
    # dh_installsystemd --no-enable --no-start: the socket is enabled again on upgrade only where the admin had
    # enabled it (debian-installed and was-enabled), and never started.
    socket_block = postinst[postinst.index("deb-systemd-helper debian-installed 'corehandler-capture.socket'"):]
    assert socket_block.index("was-enabled 'corehandler-capture.socket'") < \
        socket_block.index("enable 'corehandler-capture.socket'")
    assert not re.search(r"deb-systemd-invoke .*corehandler-capture\.socket", postinst), postinst
    assert "Recommends: elfutils" in (tmp_path / "control" / "control").read_text()


def test_the_package_ships_what_the_docs_name(deb):
    files = run("dpkg-deb", "--contents", str(deb)).stdout
    for path in ("/usr/share/corehandler/grafana/corehandler-dashboard.json",
                 "/usr/share/corehandler/prometheus/corehandler-alerts.yml",
                 "/usr/share/corehandler/prometheus/corehandler-alerts.test.yml",
                 "/usr/share/corehandler/runbook.md", "/usr/share/man/man1/corehandler.1.gz",
                 "/usr/share/man/man5/corehandler.toml.5.gz", "/usr/share/man/man8/csplice.8.gz",
                 "/usr/share/bash-completion/completions/corehandler",
                 "/usr/share/zsh/vendor-completions/_corehandler"):
        assert f".{path}\n" in files, path


def test_the_bundled_wheels_ship_as_their_records_hash_them(debs, tmp_path):
    """The private environment holds PyPI's files as the lock's hash-checked wheels have them (each wheel's
    RECORD, urlsafe base64 of sha256): no shared object stripped or rewritten by the build, in either package
    (corehandler-fleet's moved with their RECORDs to its own directory). The host package has none of the
    fleet's."""
    sites = {}
    for name, deb in debs.items():
        run("dpkg-deb", "-x", str(deb), str(tmp_path / name))
    (sites["corehandler"],) = (tmp_path / "corehandler/usr/lib/corehandler/lib").glob("python3*/site-packages")
    sites["corehandler-fleet"] = tmp_path / "corehandler-fleet/usr/lib/corehandler/fleet/site-packages"
    checked, wrong = {}, []
    for name, site in sites.items():
        checked[name] = 0
        for record in site.glob("*.dist-info/RECORD"):
            for row in csv.reader(record.open()):
                if len(row) < 2 or not row[1].startswith("sha256=") or not (site / row[0]).exists():
                    continue  # bytecode and console scripts the package leaves out
                digest = base64.urlsafe_b64encode(hashlib.sha256((site / row[0]).read_bytes()).digest())
                checked[name] += 1
                if f"sha256={digest.rstrip(b'=').decode()}" != row[1]:
                    wrong.append(f"{name}: {row[0]}")
    assert checked["corehandler"] > 200 and checked["corehandler-fleet"] > 1000 and wrong == [], (checked, wrong)
    assert not [p.name for p in sites["corehandler"].iterdir() if p.name.split("-")[0] in ("pyarrow", "duckdb", "boto3",
                                                                                         "botocore", "pyrage")]
    # The fleet's directory is on the private interpreter's path through its .pth file.
    (pth,) = (tmp_path / "corehandler-fleet/usr/lib/corehandler/lib").glob("python3*/site-packages/*.pth")
    assert pth.read_text().strip() == "/usr/lib/corehandler/fleet/site-packages"
    # The venv's libraries are offered to no other package: no shlibs control file.
    for deb in debs.values():
        assert not re.search(r"^\s+\d+ bytes,\s+\d+ lines\s+shlibs\b", run("dpkg-deb", "-I", str(deb)).stdout, re.M)


def test_csplice_has_one_place_and_no_test_program_ships(deb):
    files = run("dpkg-deb", "--contents", str(deb)).stdout
    binaries = [line.split()[-1] for line in files.splitlines()
                if re.search(r"/(csplice|feeder)\b", line) and "/usr/share/man/" not in line]  # csplice(8)
    assert binaries == [f".{CSPLICE}"], binaries  # no feeder, no link to csplice in the virtualenv


def spool_record(exe: Path) -> dict | None:
    for path in (STATE / "spool").glob("*.json"):
        record = json.loads(path.read_text())
        if record["proc"]["exe"] == str(exe):
            return record
    return None


def test_install_crash_remove_purge(deb, host_core_settings, clean_host, tmp_path_factory):
    crasher = build_crasher(tmp_path_factory.mktemp("crasher"))

    # -- install ------------------------------------------------------------------------------------------
    # One core dump handler at a time (Conflicts: core-dump-handler): apt removes systemd-coredump, which this
    # machine keeps as the benchmark's baseline; it is put back once corehandler is purged.
    had_coredump = package_state("systemd-coredump") == "installed"
    try:
        _install_crash_remove_purge(deb, crasher, tmp_path_factory)
    finally:
        if had_coredump and package_state("systemd-coredump") != "installed":
            # Its postinst applies its own 50-coredump.conf (a pattern, and fs.suid_dumpable=2, which the
            # borrow puts back at its end): the kernel's settings go back to what they were here.
            kept = sysctl("kernel/core_pattern"), sysctl("kernel/core_pipe_limit")
            run("apt-get", "install", "-y", "-q", "--no-install-recommends", "systemd-coredump")
            host_core_settings.point(*kept)


def _install_crash_remove_purge(deb, crasher, tmp_path_factory) -> None:
    run("apt-get", "install", "-y", "-q", "--no-install-recommends", str(deb))
    assert package_state() == "installed"
    pattern = sysctl("kernel/core_pattern")
    assert pattern.startswith(f"|{CSPLICE} {SPECIFIERS}"), pattern
    # The private environment finds csplice where the build said, without an environment variable.
    where = "import os; os.environ.pop('COREHANDLER_LIBEXEC', None); from corehandler import paths; " \
        "print(paths.csplice_path())"
    assert run(PYTHON, "-I", "-c", where).stdout.strip() == CSPLICE  # -I: not the source tree in the cwd
    assert int(sysctl("kernel/core_pipe_limit")) >= 16
    conffiles = run("dpkg-query", "-W", "-f=${Conffiles}", "corehandler").stdout
    assert "/etc/corehandler/corehandler.toml" in conffiles and "/etc/logrotate.d/corehandler" in conffiles
    for sub, kind in (("", "state"), ("spool", "spool"), ("store", "store")):
        st = os.stat(STATE / sub)
        assert stat.S_IMODE(st.st_mode) == DIR_MODES[kind] and st.st_uid == 0, sub
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert run("/usr/bin/corehandler", "--version").stdout.strip() == f"corehandler {version}"
    # The package owns the boot-time setting in /usr/lib/sysctl.d; `install --package` wrote none in /etc.
    assert not os.path.lexists("/etc/sysctl.d/50-corehandler.conf")

    # The installed unit, with its real /usr/bin/corehandler, passes systemd's own checks.
    unit = "/lib/systemd/system/corehandler.service"
    verify = run("systemd-analyze", "verify", unit, check=False, timeout=60)
    assert verify.returncode == 0 and verify.stderr == "", verify
    # Documentation= resolves (verify above runs man on it too): `man corehandler` works. The package's own
    # pages are asked for by man's own search of /usr/share/man: a `scripts/setup` install on the same machine
    # puts pages under /usr/local/man, which man rightly finds first.
    for page, path in (("corehandler", "man1/corehandler.1.gz"), ("corehandler.toml", "man5/corehandler.toml.5.gz"),
                       ("csplice", "man8/csplice.8.gz")):
        assert run("man", "-w", "-M", "/usr/share/man", page).stdout.strip() == f"/usr/share/man/{path}"
        assert run("man", "-w", page).returncode == 0
    shown = subprocess.run(["man", "corehandler"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PAGER": "cat", "MANWIDTH": "80"})
    assert shown.returncode == 0 and "corehandler - capture, store and inspect core dumps" in shown.stdout
    # The rules where the docs and the rules file say, as promtool reads them.
    if shutil.which("promtool"):
        assert "SUCCESS" in run("promtool", "check", "rules",
                                "/usr/share/corehandler/prometheus/corehandler-alerts.yml").stdout
    security = run("systemd-analyze", "security", "--offline=yes", "--threshold=31", unit, timeout=60)
    exposure = re.search(r"Overall exposure level for corehandler.service: ([0-9.]+)", security.stdout)
    # 1.9 before the analyser's jail; the daemon now keeps what building it takes (CAP_SYS_ADMIN for its mount
    # namespace, CAP_SETUID/SETGID/SYS_CHROOT to enter it as corehandler-analysis, @mount), so the unwinder of
    # hostile cores runs as nobody of ours; each analysis's PID namespace (RestrictNamespaces= pid) adds 0.1.
    # Still below systemd-coredump@.service's 4.5; docs/packaging.md's figure is checked exactly elsewhere.
    assert exposure and float(exposure.group(1)) <= 3.1, security.stdout

    # -- the daemon, started by the non-systemd path --------------------------------------------------------
    assert not Path("/run/systemd/system").exists(), "this test is for hosts where systemd is not PID 1"
    assert supervisor("status").returncode == 0
    assert json.loads(run("/usr/bin/corehandler", "--json", "status").stdout)["daemon"]["state"] == "running"
    first_supervisor = supervisor("status").stdout
    # An upgrade (here: the same version again) stops and restarts it, and keeps the values from before the
    # first installation, not ours.
    run("apt-get", "install", "-y", "-q", "--reinstall", str(deb))
    assert supervisor("status").returncode == 0 and supervisor("status").stdout != first_supervisor
    assert sysctl("kernel/core_pattern") == pattern
    assert f"starting: {PYTHON} -m corehandler serve" in SUPERVISOR_LOG.read_text()
    assert stat.S_IMODE(os.stat(LOGS).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(SUPERVISOR_LOG).st_mode) == 0o640

    # -- a real crash, captured by the installed csplice ----------------------------------------------------
    # The daemon is stopped first so the record waits in the spool where this test can see it.
    assert supervisor("stop").returncode == 0 and supervisor("status").returncode == EXIT_CONFLICT
    died = crash(crasher, "segv", mib=4)
    assert died.returncode == -11, died
    record = wait_for(lambda: spool_record(crasher), 30, "the crash's record in the spool")
    assert record["signal"] == 11 and record["capture"]["complete"] is True
    core = STATE / "spool" / record["core"]
    assert core.read_bytes()[:4] == b"\x7fELF" and stat.S_IMODE(core.stat().st_mode) == 0o600
    assert core.stat().st_size == record["capture"]["bytes"] > 4 << 20
    captured = core.read_bytes()
    assert supervisor("start").returncode == 0 and supervisor("status").returncode == 0

    # -- the daemon ingests it: compressed, indexed, byte-identical out of the store -------------------------
    out = tmp_path_factory.mktemp("dumps")
    wait_for(lambda: run("/usr/bin/corehandler", "dump", f"id={record['id']}", "-o", str(out / "first"),
                         check=False).returncode == 0, 60, "the spooled crash in the store")
    assert (out / "first").read_bytes() == captured
    assert crash(crasher, "segv", mib=1).returncode == -11

    def listed():
        return json.loads(run("/usr/bin/corehandler", "--json", "list", str(crasher), check=False).stdout or "[]")

    wait_for(lambda: len(listed()) == 2, 60, "the second crash in the store")
    run("/usr/bin/corehandler", "dump", str(crasher), "-o", str(out / "second"))
    assert (out / "second").read_bytes()[:4] == b"\x7fELF"

    # -- remove: the daemon stops, the kernel gets its handler back, the dumps stay ---------------------------
    run("apt-get", "remove", "-y", "-q", "corehandler")
    assert package_state() == "config-files"
    assert {name: sysctl(name) for name in FOREIGN} == FOREIGN
    assert supervisor_gone()
    assert not Path(CSPLICE).exists() and not Path("/usr/lib/corehandler").exists()
    kept = [p.name for p in STATE.rglob("*") if p.name.startswith(record["id"]) or
            p.name.startswith(f".tmp.{record['id']}")]
    assert kept, f"the crash {record['id']} is gone from {STATE} after remove"

    # -- purge: nothing of ours is left ----------------------------------------------------------------------
    run("apt-get", "purge", "-y", "-q", "corehandler")
    assert package_state() == "not-installed"
    assert {name: sysctl(name) for name in FOREIGN} == FOREIGN
    leftovers = [p for p in (STATE, LOGS, RUN, Path("/etc/corehandler"), Path("/etc/sysctl.d/50-corehandler.conf"),
                             Path("/usr/lib/sysctl.d/50-corehandler.conf"), Path("/usr/lib/corehandler"),
                             Path("/usr/libexec/corehandler"), Path("/usr/bin/corehandler"),
                             Path("/lib/systemd/system/corehandler.service"),
                             Path("/etc/systemd/system/multi-user.target.wants/corehandler.service"),
                             Path("/var/lib/systemd/deb-systemd-helper-enabled/corehandler.service.dsh-also"))
                 if os.path.lexists(p)]
    assert leftovers == []


def supervisor_gone() -> bool:
    """No supervisor or daemon of the package's is alive (the package's python is gone with it)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline[:1] == [PYTHON.encode()] and b"corehandler" in b" ".join(cmdline):
                return False
    return True


@pytest.mark.parametrize("saved", [True, False], ids=["saved-values", "nothing-saved"])
def test_postrm_gives_the_kernel_a_handler_back_when_prerm_could_not(host_core_settings, clean_host, saved):
    """prerm restores through `corehandler uninstall`; if that failed (or dpkg --force skipped it), the
    kernel must not be left naming a csplice that is gone: postrm, which runs without Python, restores
    what the postinst saved, or the kernel's defaults."""
    host_core_settings.point(f"|{CSPLICE} {SPECIFIERS}", 16)
    STATE.mkdir(mode=0o700)
    if saved:  # as host/handler.py's claim saves it
        (STATE / "previous-handler.conf").write_text(
            "".join(f"{name.replace('/', '.')} = {value}\n" for name, value in FOREIGN.items())
            + "corehandler.csplice_conf = absent\ncorehandler.sysctl_d = absent\n")
    result = run("sh", str(ROOT / "debian" / "corehandler.postrm"), "purge")
    expected = FOREIGN if saved else {"kernel/core_pattern": "core", "kernel/core_pipe_limit": "0"}
    assert {name: sysctl(name) for name in FOREIGN} == expected
    assert "corehandler: restored kernel.core_pattern" in result.stderr
    assert not STATE.exists()
