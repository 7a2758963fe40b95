"""The files the package ships, checked with the tools that will read them: systemd-analyze for the unit,
systemd-tmpfiles for the tmpfiles.d file, and the contracts in docs/design.md for the sysctl.d template.

The installed copies are checked again, as installed, by tests/system/test_packaging.py.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from corehandler import paths
from corehandler.cli import manpage
from corehandler.config import KernelConfig
from corehandler.csplice_contract import SPECIFIERS
from corehandler.host import install
from corehandler.paths import DIR_MODES

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "packaging" / "systemd" / "corehandler.service"
DROPINS = sorted((ROOT / "packaging" / "systemd").glob("*.conf"))
SYSCTL_TEMPLATE = ROOT / "packaging" / "sysctl.d" / "50-corehandler.conf.in"
TMPFILES = ROOT / "packaging" / "tmpfiles.d" / "corehandler.conf"
INSTALLED_CSPLICE = "/usr/libexec/corehandler/csplice"
# systemd-analyze security's 0-10 scale; systemd-coredump@.service itself scores 4.5 on Debian 12. 3.0, not
# the 1.9 of a daemon without capabilities: the analyser's jail needs its namespaces, mounts and the drop to
# its own user, so that the unwinder runs with none (issue 20); 3.1 since the jail's PID namespace (issue 34),
# which keeps one analysis from seeing another and ends whatever an unwinder starts.
MAX_EXPOSURE = 3.1
# corehandler-capture@.service: 9.5 before its sandbox, 1.9 with it. What is left is what csplice's job is: root
# (it writes root's spool and reads every user's /proc/PID, CAP_SYS_PTRACE), /proc unhidden (ProtectProc=,
# ProcSubset=: the crashed process, PID 1's namespaces, /proc/sys/kernel/random/boot_id, /proc/stat's btime)
# and the kernel log (ProtectKernelLogs= would take /dev/kmsg). 2.5 leaves room for one more capability a
# capture strategy may need, and stays far below systemd-coredump@'s 4.5.
CAPTURE_UNIT = ROOT / "packaging" / "systemd" / "corehandler-capture@.service"
CAPTURE_MAX_EXPOSURE = 2.5
# verify runs `man` on Documentation=: the pages are generated at install time, checked below and by the
# package test instead.
MAN_NO = "--man=no"


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    return path


def unit_directives(text: str) -> dict[str, list[str]]:
    """Key -> every value it is given (systemd allows repeats), across sections."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def runnable_unit(tmp_path: Path) -> Path:
    """The unit with its one packaged path, /usr/bin/corehandler, replaced by this interpreter running the
    same module, so that `verify` can check the command exists on a machine without the package."""
    text = UNIT.read_text()
    assert "ExecStart=/usr/bin/corehandler serve\n" in text
    unit = tmp_path / "corehandler.service"
    unit.write_text(text.replace("ExecStart=/usr/bin/corehandler serve",
                                 f"ExecStart={sys.executable} -m corehandler serve"))
    return unit


def test_systemd_analyze_verify_is_clean(tmp_path):
    result = subprocess.run([systemd_analyze(), "verify", MAN_NO, str(runnable_unit(tmp_path))], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result


def exposure(unit: Path) -> float:
    result = subprocess.run([systemd_analyze(), "security", "--offline=yes", "--no-pager", str(unit)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result
    found = re.search(r"Overall exposure level for [\w@.-]+\.service: (\d+\.\d+) ", result.stdout)
    assert found, result.stdout
    return float(found.group(1))


def test_systemd_analyze_security_rates_it_better_than_systemd_coredump(tmp_path):
    assert exposure(UNIT) <= MAX_EXPOSURE
    # The no-metrics drop-in only tightens it.
    merged = tmp_path / "corehandler.service"
    merged.write_text(UNIT.read_text() + (ROOT / "packaging/systemd/no-metrics.conf").read_text())
    assert exposure(merged) < exposure(UNIT)


def _said(doc: str, pattern: str) -> tuple[str, ...]:
    """What the docs say where pattern (whitespace-tolerant: the docs wrap lines) matches, once."""
    text = (ROOT / doc).read_text()
    found = re.findall(pattern.replace(" ", r"\s+"), text)
    assert len(found) == 1, f"{doc} no longer says {pattern!r} once: update the docs and this test together"
    return found[0] if isinstance(found[0], tuple) else (found[0],)


def test_the_docs_say_the_exposure_and_capabilities_measured_here(tmp_path):
    """docs/packaging.md's figures are this test's: a unit change that moves them fails until the docs follow."""
    merged = tmp_path / "corehandler.service"
    merged.write_text(UNIT.read_text() + (ROOT / "packaging/systemd/no-metrics.conf").read_text())
    daemon, no_metrics, systemd = _said("docs/packaging.md", r"rates its exposure (\d\.\d) \(\"OK\"; (\d\.\d) with the "
                                        r"no-metrics drop-in; systemd-coredump@\.service scores 4\.5 on the same "
                                        r"systemd (\d+)\)")
    (capture,) = _said("docs/packaging.md", r"`systemd-analyze security` rates it (\d\.\d) \(v0\.2's unit")
    version = subprocess.run([systemd_analyze(), "--version"], capture_output=True, text=True).stdout.split()[1]
    if version != systemd:  # another systemd weighs the same settings differently: the ceilings still hold
        pytest.skip(f"the docs' figures are systemd {systemd}'s; this is systemd {version}")
    assert (exposure(UNIT), exposure(merged), exposure(CAPTURE_UNIT)) == \
        (float(daemon), float(no_metrics), float(capture))
    (daemon_caps,) = _said("docs/packaging.md", r"Its capabilities are the analyser's jail's, `([A-Z_ ]+)`")
    assert daemon_caps.split() == unit_directives(UNIT.read_text())["CapabilityBoundingSet"][0].split()
    capture_caps = _said("docs/packaging.md", r"root with only `(CAP_[A-Z_]+)` \([^)]*\) and `(CAP_[A-Z_]+)`")
    assert list(capture_caps) == unit_directives(CAPTURE_UNIT.read_text())["CapabilityBoundingSet"][0].split()


def test_the_docs_say_the_modes_the_code_and_tmpfiles_set():
    modes = {kind: f"{mode:04o}" for kind, mode in DIR_MODES.items()}
    tmpfiles = {line.split()[1]: line.split()[2] for line in TMPFILES.read_text().splitlines()
                if line.startswith("d ")}
    assert tmpfiles == {"/var/lib/corehandler": modes["state"], "/var/lib/corehandler/spool": modes["spool"],
                        "/var/lib/corehandler/store": modes["store"]}
    assert _said("docs/packaging.md", r"`/var/lib/corehandler` (\d{4}), its `spool/` (\d{4}) and `store/` (\d{4})") == \
        (modes["state"], modes["spool"], modes["store"])
    assert _said("docs/design.md", r"all root's: state (\d{4}), `spool/` (\d{4}), `store/` (\d{4}), `users/` (\d{4})") \
        == (modes["state"], modes["spool"], modes["store"], modes["users"])
    assert _said("README.md", r"\(root's; spool (\d{4}), store (\d{4})\)") == (modes["spool"], modes["store"])
    assert _said("README.md", r"the spool is (\d{4}), the state and store directories (\d{4})") == \
        (modes["spool"], modes["state"]) and modes["state"] == modes["store"]
    assert _said("docs/design.md", r"Index `index\.sqlite` \((\d{4}), root only") == ("0600",)


def test_the_capture_unit_is_sandboxed_to_what_csplice_needs():
    """v0.2's corehandler-capture@.service scored 9.5 UNSAFE: full root for a program that reads what a crashing
    process chose. It keeps what csplice does (tests/local/test_csplice_*.py run the same binary)."""
    assert exposure(CAPTURE_UNIT) <= CAPTURE_MAX_EXPOSURE
    d = unit_directives(CAPTURE_UNIT.read_text())
    assert d["CapabilityBoundingSet"] == ["CAP_SYS_PTRACE CAP_DAC_READ_SEARCH"] and d["NoNewPrivileges"] == ["yes"]
    assert d["ProtectSystem"] == ["strict"] and d["ReadWritePaths"] == [str(paths.DEFAULT_STATE_DIR)]
    assert paths.CSPLICE_SETTINGS.parent == paths.DEFAULT_STATE_DIR
    # csplice's log, the crashed process's /proc and the host's: none of these may be hidden.
    assert d["BindPaths"] == ["/dev/kmsg"] and d["DeviceAllow"] == ["/dev/kmsg w"]
    assert not {"ProtectKernelLogs", "ProtectProc", "ProcSubset", "PrivateUsers", "User", "DynamicUser"} & set(d)
    assert d["PrivateNetwork"] == ["yes"] and d["RestrictAddressFamilies"] == ["AF_UNIX"]


def test_the_unit_runs_the_daemon_as_the_design_says():
    d = unit_directives(UNIT.read_text())
    assert d["ExecStart"] == ["/usr/bin/corehandler serve"]
    assert d["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert d["Restart"] == ["on-failure"]
    assert d["StateDirectory"] == ["corehandler"] and d["StateDirectoryMode"] == [f"{DIR_MODES['state']:04o}"]
    # Only what the analyser's jail needs to drop to its own user in its own view (corehandler/analysis/jail.py).
    assert set(d["CapabilityBoundingSet"][0].split()) == {"CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_SYS_ADMIN",
                                                          "CAP_SYS_CHROOT", "CAP_CHOWN"}
    assert d["RestrictNamespaces"] == ["mnt net ipc pid"]
    assert d["ProtectSystem"] == ["strict"] and d["NoNewPrivileges"] == ["yes"]
    assert d["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    # It must read /proc/sys (kernel settings for `status`-like checks): no ProcSubset=pid.
    assert "ProcSubset" not in d
    assert "PrivateNetwork" not in d  # metrics are on by default; the drop-in turns the network off
    # systemd knows when it is ready and restarts it when it hangs (observe/sdnotify.py).
    assert d["Type"] == ["notify"] and d["WatchdogSec"] == ["10min"]
    # What Documentation= names resolves: the generated man pages (a .md in /usr/share/doc is gzipped).
    assert d["Documentation"] == ["man:corehandler(1) man:corehandler.toml(5) man:csplice(8)"]
    assert UNIT.read_text() == (ROOT / "debian" / "corehandler.service").read_text()


def test_every_unit_documents_itself_with_a_man_page_we_generate():
    generated = {name.rsplit(".", 1)[0] + f"({name.rsplit('.', 1)[1]})" for name in manpage.pages()}
    for unit in (ROOT / "packaging" / "systemd").glob("corehandler*.[a-z]*"):
        if unit.suffix in (".service", ".socket"):
            docs = [w for d in unit_directives(unit.read_text())["Documentation"] for w in d.split()]
            assert docs and {w.removeprefix("man:") for w in docs} <= generated, unit.name


def test_the_example_dropins_are_valid_units(tmp_path):
    for dropin in DROPINS:
        merged = tmp_path / "corehandler.service"
        merged.write_text(runnable_unit(tmp_path).read_text() + dropin.read_text())
        result = subprocess.run([systemd_analyze(), "verify", MAN_NO, str(merged)], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0 and result.stderr == "", (dropin.name, result)


def sysctl_values(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith(("#", ";")):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def test_the_sysctl_template_names_csplice_with_the_design_argv():
    rendered = SYSCTL_TEMPLATE.read_text().replace("@CSPLICE@", INSTALLED_CSPLICE)
    values = sysctl_values(rendered)
    assert set(values) == {"kernel.core_pattern", "kernel.core_pipe_limit"}
    # What install sets, on every kernel: after a reboot status must still find this installation's pattern.
    assert values["kernel.core_pattern"] == f"|{INSTALLED_CSPLICE} {SPECIFIERS} %F"
    assert values["kernel.core_pattern"] == install.core_pattern_for(Path(INSTALLED_CSPLICE))
    # The kernel cuts core_pattern at 127 characters, silently.
    assert len(values["kernel.core_pattern"]) <= 127
    assert int(values["kernel.core_pipe_limit"]) > 0  # /proc/PID must outlive the capture
    # Applied after systemd's 50-coredump.conf at boot (sysctl.d files apply in name order, later wins).
    assert sorted(["50-coredump.conf", "50-corehandler.conf"])[-1] == "50-corehandler.conf"


def test_debian_version_is_the_project_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    first = (ROOT / "debian" / "changelog").read_text().splitlines()[0]
    # 3.0 (native): no Debian revision; a semver pre-release (0.5.0-rc.1) is dpkg's 0.5.0~rc.1 (scripts/release)
    debian = project.split("+", 1)[0].replace("-", "~", 1)
    assert re.match(rf"corehandler \({re.escape(debian)}\) ", first), (project, first)


@pytest.mark.root
def test_tmpfiles_creates_the_state_dirs_root_only(tmp_path):
    tool = shutil.which("systemd-tmpfiles")
    if tool is None:
        pytest.skip("systemd-tmpfiles is not installed (apt-get install systemd)")
    result = subprocess.run([tool, "--create", f"--root={tmp_path}", str(TMPFILES)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result
    for sub, kind in (("", "state"), ("spool", "spool"), ("store", "store")):
        st = os.stat(tmp_path / "var/lib/corehandler" / sub)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == DIR_MODES[kind] and st.st_uid == 0, sub


def test_the_wheel_holds_csplice_in_one_place_and_no_test_program():
    """csplice in the environment's libexec/corehandler (where corehandler.paths looks), nothing inside the
    package, and no feeder anywhere: tests build it themselves (support/cbuild.py)."""
    import corehandler
    from corehandler import paths

    if os.environ.get("COREHANDLER_LIBEXEC"):
        pytest.skip("COREHANDLER_LIBEXEC points at a development build tree")
    assert sorted(os.listdir(paths.libexec_dir())) == ["csplice"]
    package = Path(corehandler.__file__).parent
    assert not (package / "libexec").exists()
    assert [p for p in package.rglob("*") if p.name in ("csplice", "feeder")] == []


def test_socket_mode_units_verify_and_match_the_config(tmp_path):
    """corehandler-capture.socket (Accept=yes) + corehandler-capture@.service: valid for systemd, listening
    where [kernel] socket_path says, root-only, and running csplice with the connection on stdin."""
    socket_unit = ROOT / "packaging" / "systemd" / "corehandler-capture.socket"
    service = ROOT / "packaging" / "systemd" / "corehandler-capture@.service"
    d = unit_directives(socket_unit.read_text())
    assert d["ListenStream"] == [str(KernelConfig().socket_path)]
    assert d["Accept"] == ["yes"] and d["SocketMode"] == ["0600"] and d["DirectoryMode"] == ["0700"]
    assert d["MaxConnections"] == [str(KernelConfig().socket_max_connections)]
    s = unit_directives(service.read_text())
    assert s["ExecStart"] == [INSTALLED_CSPLICE] and s["StandardInput"] == ["socket"]
    # verify needs the command to exist: this build's csplice stands in for the packaged path.
    shutil.copy(socket_unit, tmp_path / socket_unit.name)
    (tmp_path / service.name).write_text(service.read_text().replace(INSTALLED_CSPLICE, str(paths.csplice_path())))
    # An instance, as Accept=yes starts one per connection: verify checks the template only through it.
    result = subprocess.run([systemd_analyze(), "verify", MAN_NO, socket_unit.name, "corehandler-capture@0.service"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == "", result
