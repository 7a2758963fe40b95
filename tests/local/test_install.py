"""install / uninstall / status against a fake host (tests/local/fakehost.py): no root, nothing of the host's."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import yaml
from fakehost import SYSTEMD_PATTERN, FakeHost

from corehandler import csplice_contract
from corehandler.cli.install import _capture_line
from corehandler.config import Config
from corehandler.errors import (
    EXIT_CONFLICT,
    EXIT_PERMISSION,
    HandlerConflictError,
    NotRootError,
    SystemFailure,
    UnsafePathError,
)
from corehandler.host import handler, install, overview, sysctl
from corehandler.observe.metrics import MetricsObserver
from corehandler.paths import DIR_MODES
from corehandler.store.dumprow import row_from_record
from corehandler.store.index import Store

SPECS = csplice_contract.SPECIFIERS


@pytest.fixture
def host(tmp_path, csplice, monkeypatch, short_dir) -> FakeHost:
    return FakeHost(tmp_path, csplice, monkeypatch, bin_dir=short_dir)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_core_pattern_carries_pidfd_on_every_kernel(tmp_path):
    """What the package's sysctl.d file sets at boot: a kernel before 6.16 passes csplice nothing for %F."""
    assert install.core_pattern_for(tmp_path / "csplice") == f"|{tmp_path}/csplice {SPECS} %F"


def test_core_pattern_length_limit(tmp_path):
    longest = "/" + "d" * (127 - len(f"| {SPECS} %F") - len("/csplice") - 1) + "/csplice"
    assert len(install.core_pattern_for(Path(longest))) == 127
    too_long = Path("/x" + longest)
    with pytest.raises(SystemFailure, match="would be 129 characters, the kernel takes at most 127"):
        install.core_pattern_for(too_long)
    with pytest.raises(SystemFailure, match="whitespace"):
        install.core_pattern_for(tmp_path / "my dir" / "csplice")


def test_is_ours():
    assert handler.is_corehandler(f"|/usr/libexec/corehandler/csplice {SPECS}")
    assert handler.is_corehandler("|/opt/venv/lib/corehandler/libexec/csplice %P")
    assert not handler.is_corehandler(SYSTEMD_PATTERN)
    assert not handler.is_corehandler("core")
    assert not handler.is_corehandler("/var/crash/csplice")  # a file pattern, not a pipe
    assert handler.handler_program(SYSTEMD_PATTERN) == "/lib/systemd/systemd-coredump"
    assert handler.handler_program("core.%p") is None


def test_install_over_a_file_pattern(host):
    done = install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    pattern = f"|{host.csplice} {SPECS} %F"
    assert host.get("core_pattern") == pattern
    assert host.get("core_pipe_limit") == "16"
    assert done["core_pattern"] == pattern and done["replaced"] == "core"
    assert done["csplice_version"]
    assert sysctl.read_sysctl_d(host.machine.sysctl_d) == {"kernel.core_pattern": pattern,
                                "kernel.core_pipe_limit": "16"}
    for d, kind in ((host.paths.state_dir, "state"), (host.paths.spool_dir, "spool"), (host.paths.store_dir, "store")):
        assert mode(d) == DIR_MODES[kind]
    saved = handler.read_previous(host.paths)
    assert saved.sysctls == {"kernel.core_pattern": "core", "kernel.core_pipe_limit": "0"}
    assert saved.settings is None and saved.sysctl_d is None
    assert mode(host.paths.previous_handler) == 0o600
    text = host.machine.csplice_settings.read_text()
    assert text == handler.settings_for(Config().capture, host.paths, host.machine)
    assert f"spool_dir={host.paths.spool_dir}\n" in text
    assert f"owner={host.paths.state_dir}\ninstallation={done['installation']}\n" in text


def test_install_tightens_existing_state_dirs(host):
    host.paths.spool_dir.mkdir(parents=True, mode=0o777)
    os.chmod(host.paths.spool_dir, 0o777)
    os.chmod(host.paths.state_dir, 0o755)
    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    assert mode(host.paths.state_dir) == DIR_MODES["state"] and mode(host.paths.spool_dir) == DIR_MODES["spool"]


def test_an_old_kernel_gets_the_boot_time_pattern_too(tmp_path, csplice, monkeypatch, short_dir):
    """%F on 6.1 too: the package's sysctl.d file sets it at every boot, and status must match it afterwards."""
    host = FakeHost(tmp_path, csplice, monkeypatch, release="6.1.0-26-amd64", bin_dir=short_dir)
    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    assert host.get("core_pattern") == f"|{host.csplice} {SPECS} %F"


def test_another_handler_is_refused_without_force(host):
    host.set("core_pattern", SYSTEMD_PATTERN)
    with pytest.raises(HandlerConflictError, match="another core handler is installed "
                                                   r"\(/lib/systemd/systemd-coredump\).*--force") as err:
        install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    assert err.value.exit_code == EXIT_CONFLICT
    assert host.get("core_pattern") == SYSTEMD_PATTERN
    assert not host.paths.state_dir.exists() and not host.machine.sysctl_d.exists()


def test_force_replace_then_uninstall_restores_exactly(host):
    host.set("core_pattern", SYSTEMD_PATTERN + "  ")  # trailing spaces are part of the value
    host.set("core_pipe_limit", "0")
    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice, force=True)
    assert handler.is_corehandler(host.get("core_pattern"))
    done = install.uninstall(host.paths, host=host.machine)
    assert host.get("core_pattern") == SYSTEMD_PATTERN + "  "
    assert host.get("core_pipe_limit") == "0"
    assert done["restored_from"] == "saved" and done["sysctl_d_removed"]
    assert sysctl.read_sysctl_d(host.machine.sysctl_d) is None
    assert not host.paths.previous_handler.exists()
    # Dumps are never deleted by uninstall.
    assert host.paths.spool_dir.is_dir()


def test_reinstall_keeps_the_values_from_before_the_first_install(host):
    host.set("core_pattern", "/var/crash/core.%p")
    host.set("core_pipe_limit", "4")
    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    first = host.paths.previous_handler.read_bytes()
    done = install.install(Config.model_validate({"capture": {"max_pending": 3}}), host.paths, host=host.machine,
                           csplice=host.csplice)
    assert not done["previous_saved"] and done["replaced"] is None
    assert host.paths.previous_handler.read_bytes() == first
    assert "max_pending=3" in host.machine.csplice_settings.read_text()
    install.uninstall(host.paths, host=host.machine)
    assert (host.get("core_pattern"), host.get("core_pipe_limit")) == ("/var/crash/core.%p", "4")


def test_larger_pipe_limit_is_kept(host):
    host.set("core_pipe_limit", "64")
    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    assert host.get("core_pipe_limit") == "64"
    install.uninstall(host.paths, host=host.machine)
    assert host.get("core_pipe_limit") == "64"


def test_uninstall_without_saved_values_restores_kernel_defaults(host):
    host.set("core_pattern", f"|/somewhere/else/csplice {SPECS}")
    host.set("core_pipe_limit", "16")
    done = install.uninstall(host.paths, host=host.machine)
    assert done["restored_from"] == "kernel defaults"
    assert (host.get("core_pattern"), host.get("core_pipe_limit")) == ("core", "0")


def test_uninstall_leaves_another_handler_alone(host):
    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    host.set("core_pattern", SYSTEMD_PATTERN)  # someone else took over since
    done = install.uninstall(host.paths, host=host.machine)
    assert done["restored"] is None and done["restored_from"] is None and done["left_alone"] == SYSTEMD_PATTERN
    assert not done["was_installed"]
    assert not host.paths.previous_handler.exists()
    assert host.get("core_pattern") == SYSTEMD_PATTERN and host.get("core_pipe_limit") == "16"
    assert done["sysctl_d_removed"]


def test_a_refused_core_pattern_leaves_nothing_half_installed(host):
    host.set("core_pipe_limit", "2")
    pattern_file = host.kernel / "core_pattern"
    pattern_file.unlink()  # not the host's: the fake kernel
    # not the host's: accepts writes, reads back empty: as a kernel refusing the value
    pattern_file.symlink_to("/dev/null")
    with pytest.raises(SystemFailure, match="kernel.core_pattern was set to .* but the kernel reports ''"):
        install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    assert host.get("core_pipe_limit") == "2"
    assert sysctl.read_sysctl_d(host.machine.sysctl_d) is None


def test_not_root_is_refused(host, monkeypatch):
    monkeypatch.setattr(install.os, "geteuid", lambda: install.ROOT_UID + 1000)
    for verb in (lambda: install.install(Config(), host.paths, host=host.machine, csplice=host.csplice),
                 lambda: install.uninstall(host.paths, host=host.machine)):
        with pytest.raises(NotRootError, match="needs root") as err:
            verb()
        assert err.value.exit_code == EXIT_PERMISSION
    assert host.get("core_pattern") == "core"


@pytest.mark.parametrize("make_unsafe, message", [
    (lambda h: os.chmod(h.csplice, 0o775), r"csplice is writable by group or others \(mode 0775\)"),
    (lambda h: os.chmod(h.csplice, 0o757), "writable by group or others"),
    (lambda h: os.chmod(h.csplice.parent, 0o777), r"corehandler is writable by group or others \(mode 0777\)"),
    (lambda h: os.chmod(h.csplice, 0o644), "not an executable file"),
])
def test_unsafe_csplice_path_is_refused(host, make_unsafe, message):
    make_unsafe(host)
    with pytest.raises(UnsafePathError, match=message) as err:
        install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    assert err.value.exit_code == EXIT_PERMISSION
    assert host.get("core_pattern") == "core"


def test_csplice_owned_by_another_user_is_refused(host):
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    os.chown(host.csplice.parent, 1234, 1234)
    with pytest.raises(UnsafePathError, match="is owned by uid 1234, not root"):
        install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)


def test_sticky_world_writable_directory_is_accepted(host):
    os.chmod(host.csplice.parent.parent, 0o1777)
    assert install.check_handler_path(host.csplice) == host.csplice


def test_symlinked_csplice_is_installed_by_its_real_path(host, tmp_path):
    link = tmp_path / "link-csplice"
    link.symlink_to(host.csplice)
    install.install(Config(), host.paths, host=host.machine, csplice=link)
    assert host.get("core_pattern").startswith(f"|{host.csplice} ")


def test_missing_csplice(host):
    with pytest.raises(SystemFailure, match="csplice not found"):
        install.install(Config(), host.paths, host=host.machine, csplice=host.csplice.parent / "nope")


def test_start_daemon_hook(host):
    calls = []
    done = install.install(Config(), host.paths, host=host.machine, csplice=host.csplice, start_daemon=calls.append)
    assert calls == [host.paths] and done["daemon_started"]
    stops = []
    install.uninstall(host.paths, host=host.machine, stop_daemon=stops.append)
    assert stops == [host.paths]


def test_status_before_and_after_install(host):
    before = overview.status(Config(), host.paths, host=host.machine, csplice=host.csplice)
    assert before["installed"] is False and before["core_pattern"] == "core"
    assert before["core_pattern_matches"] is False and before["core_pipe_limit_ok"] is False
    assert before["sysctl_d"]["exists"] is False and before["previous"] is None
    assert before["settings"]["state"].startswith("missing")
    assert before["spool"] == {"path": str(host.paths.spool_dir), "exists": False, "pending": 0,
                               "orphans": None, "bytes": 0}
    assert before["store"] is None
    assert before["csplice"]["version"] and before["csplice"]["problem"] is None
    json.dumps(before)

    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    after = overview.status(Config(), host.paths, host=host.machine, csplice=host.csplice)
    assert after["installed"] and after["core_pattern_matches"] and after["core_pipe_limit_ok"]
    assert after["core_pipe_limit"] == 16
    assert after["sysctl_d"] == {"path": str(host.machine.sysctl_d / "50-corehandler.conf"), "exists": True,
                                 "matches_live": True}
    assert after["previous"]["kernel.core_pattern"] == "core"
    assert after["settings"]["state"] == "current"
    changed = Config.model_validate({"capture": {"fsync": True}})
    assert overview.status(changed, host.paths, host=host.machine,
                           csplice=host.csplice)["settings"]["state"].startswith("differs")


def test_status_counts_spool_and_store(host):
    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    spool = host.paths.spool_dir
    for i in range(3):
        (spool / f"1700000000{i}-0123456789abcdef-{100 + i}.json").write_text("{}")
        (spool / f"1700000000{i}-0123456789abcdef-{100 + i}.core").write_bytes(b"\x7fELF" + b"x" * 8192)
    (spool / ".tmp.17000000009-0123456789abcdef-9.json").write_text("{")  # not committed: not pending
    with Store(host.paths.state_dir) as store:
        for n, size in enumerate((1000, 2000, 4000)):
            store.insert(row_from_record({"id": f"1700000000{n}-0123456789abcdef-{n}"}, status="ok", problem=None,
                                         path=None, raw_bytes=size, stored_bytes=size, sha256=None))
        # A dump retention deleted (its count kept per rule) is no stored dump.
        store.delete(store.get("17000000002-0123456789abcdef-2"), "max_count")
    st = overview.status(Config(), host.paths, host=host.machine, csplice=host.csplice)
    assert st["spool"]["pending"] == 3
    assert st["spool"]["bytes"] >= 3 * 8196
    assert st["store"] == {"path": str(host.paths.index_path), "count": 2, "bytes": 3000, "corrupt": 0}


def test_status_reports_an_unreadable_index_instead_of_failing(host):
    host.paths.state_dir.mkdir(parents=True)
    host.paths.index_path.write_bytes(b"not a database" * 100)
    st = overview.status(Config(), host.paths, host=host.machine, csplice=host.csplice)
    assert "error" in st["store"]


def test_status_reports_an_unsafe_csplice(host):
    os.chmod(host.csplice, 0o777)
    st = overview.status(Config(), host.paths, host=host.machine, csplice=host.csplice)
    assert "writable by group or others" in st["csplice"]["problem"]
    assert st["core_pattern_expected"] is None


def test_install_over_another_installations_csplice_puts_it_back_on_uninstall(host):
    """scripts/setup's /opt/corehandler is live and this install has its own state dir (the system tests'): it
    is refused naming that installation, and forced, uninstall gives that installation its handler back,
    csplice.conf and all."""
    opt = host.installation("opt")
    install.install(Config(), opt, host=host.machine, csplice=host.csplice)
    other = host.get("core_pattern")
    before = host.machine.csplice_settings.read_bytes(), sysctl.read_sysctl_d(host.machine.sysctl_d)
    with pytest.raises(HandlerConflictError, match=f"the installation in {opt.state_dir}"):
        install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    done = install.install(Config(), host.paths, host=host.machine, csplice=host.csplice, force=True)
    assert done["previous_saved"] and done["replaced"] == other
    assert not handler.owns(host.machine, opt) and handler.owns(host.machine, host.paths)
    install.uninstall(host.paths, host=host.machine)
    assert (host.get("core_pattern"), host.get("core_pipe_limit")) == (other, "16")
    assert (host.machine.csplice_settings.read_bytes(), sysctl.read_sysctl_d(host.machine.sysctl_d)) == before
    assert handler.owns(host.machine, opt)


def test_reinstall_from_another_path_keeps_the_values_from_before_the_first_install(host, tmp_path):
    host.set("core_pattern", "/var/crash/core.%p")
    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    moved = host.csplice.parent.parent / "moved" / "csplice"
    moved.parent.mkdir()
    shutil.copy(host.csplice, moved)
    done = install.install(Config(), host.paths, host=host.machine, csplice=moved)
    assert not done["previous_saved"] and done["replaced"] is None
    install.uninstall(host.paths, host=host.machine)
    assert host.get("core_pattern") == "/var/crash/core.%p"


def test_the_capture_mode_is_this_installations_own(host):
    """corehandler_capture_mode (capture_state) is "none" for a daemon whose installation does not own the
    handler, so CorehandlerNotTheHandler fires where crashes stopped coming, not where they go elsewhere by design."""
    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    other = host.installation("other")
    assert overview.capture_state(Config(), host.paths, host.machine)["mode"] == "pipe"
    assert overview.capture_state(Config(), other, host.machine)["mode"] is None
    host.set("core_pattern", SYSTEMD_PATTERN)  # apt's systemd-coredump took the handler
    assert overview.capture_state(Config(), host.paths, host.machine)["mode"] is None


def test_a_handler_taken_while_csplice_conf_names_this_installation_shows_and_alerts(host):
    """systemd-coredump's postinst re-applies its pattern on every systemd update: csplice.conf still names this
    installation, the kernel runs another handler. The scrape says so (corehandler_handler_displaced, which
    CorehandlerHandlerDisplaced alerts on with the runbook's fix) and so does status; another installation's
    daemon, or one that was never installed, is not displaced."""
    before = host.get("core_pattern")
    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    other = host.installation("other")

    def scrape(paths) -> str:
        probe = lambda: overview.capture_state(Config(), paths, host.machine)  # noqa: E731 - what serve passes
        return MetricsObserver(capture_probe=probe).exposition().decode()

    assert "corehandler_handler_displaced 0.0" in scrape(host.paths)
    host.set("core_pattern", SYSTEMD_PATTERN)
    assert handler.settings_owner_of(host.machine).state_dir == str(host.paths.state_dir)
    text = scrape(host.paths)
    assert "corehandler_handler_displaced 1.0" in text and 'corehandler_capture_mode{mode="none"} 1.0' in text
    assert "corehandler_handler_displaced 0.0" in scrape(other)
    capture = overview.status(Config(), host.paths, host=host.machine, csplice=host.csplice)["capture"]
    assert capture["displaced"] and _capture_line(capture).startswith(
        "NOBODY: the kernel runs /lib/systemd/systemd-coredump although csplice.conf names this installation")
    assert "`corehandler install --force` takes it back" in _capture_line(capture)
    rules = yaml.safe_load((Path(__file__).parents[2] / "packaging/prometheus/corehandler-alerts.yml").read_text())
    [rule] = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "CorehandlerHandlerDisplaced"]
    assert rule["expr"] == "corehandler_handler_displaced == 1" and "corehandler install --force" in \
        rule["annotations"]["description"]

    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice, force=True)  # the fix
    assert "corehandler_handler_displaced 0.0" in scrape(host.paths)
    # Uninstall gives back what the host had before this installation's first claim, csplice.conf included.
    install.uninstall(host.paths, host=host.machine)
    assert host.get("core_pattern") == before and "corehandler_handler_displaced 0.0" in scrape(host.paths)
