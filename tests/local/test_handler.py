"""host/handler.py, the one writer of host state, on a fake host under tmp_path: claim, refresh, release and
borrow; who owns the handler; what was there before comes back exactly; the host lock shared with children."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from corehandler.config import CaptureConfig
from corehandler.csplice_contract import Facts, Owner, render_settings, settings_owner
from corehandler.errors import HandlerConflictError, SystemFailure
from corehandler.host import handler, sysctl
from corehandler.host.sysctl import CORE_PATTERN, CORE_PIPE_LIMIT
from corehandler.paths import Host, Paths

SYSTEMD = "|/lib/systemd/systemd-coredump %P %u %g %s %t 9223372036854775808 %h %d"
PATTERN = "|/opt/x/libexec/csplice %P %i %I %u %g %d %s %t %c %h %e"
FACTS = Facts("rw", 16 << 20, 400 << 20)


@pytest.fixture
def host(tmp_path) -> Host:
    kernel = tmp_path / "proc/sys/kernel"
    kernel.mkdir(parents=True)
    (kernel / "core_pattern").write_text(SYSTEMD + "\n")  # not the host's: the fake kernel under tmp_path
    (kernel / "core_pipe_limit").write_text("0\n")  # not the host's: the fake kernel under tmp_path
    (tmp_path / "var/lib/corehandler").mkdir(parents=True)
    (tmp_path / "run").mkdir()
    return Host(proc_root=tmp_path / "proc", sysctl_d=tmp_path / "etc/sysctl.d",
                csplice_settings=tmp_path / "var/lib/corehandler/csplice.conf",
                lock=tmp_path / "run/corehandler/lock/core-pattern.lock")


def installation(tmp_path: Path, name: str) -> Paths:
    paths = Paths(state_dir=tmp_path / name)
    paths.spool_dir.mkdir(parents=True)
    return paths


def settings(paths: Paths, **capture) -> str:
    return render_settings(CaptureConfig(**capture), paths.spool_dir, FACTS, handler.this_installation(paths))


def claim(host: Host, paths: Paths, *, force: bool = False, pattern: str = PATTERN, persist: bool | None = True):
    with handler.claim(host, paths, force=force) as c:
        c.write_settings(settings(paths))
        c.point({CORE_PATTERN: pattern, CORE_PIPE_LIMIT: "16"}, persist=persist)
    return c


def kernel(host: Host) -> dict[str, str]:
    return handler.live(host)


def files(host: Host) -> tuple[bytes | None, bytes | None]:
    def read(path):
        return path.read_bytes() if path.exists() else None
    return read(host.csplice_settings), read(sysctl.sysctl_d_file(host.sysctl_d))


def test_a_claim_saves_what_was_there_once_and_names_its_installation(host, tmp_path):
    native = installation(tmp_path, "native")
    c = claim(host, native, force=True)
    assert c.replaced == SYSTEMD and kernel(host) == {CORE_PATTERN: PATTERN, CORE_PIPE_LIMIT: "16"}
    assert handler.owner(host) == Owner(str(native.state_dir), handler.installation_id(native))
    assert handler.owns(host, native) and len(handler.installation_id(native)) == 16
    assert stat.S_IMODE(host.csplice_settings.stat().st_mode) == 0o644
    assert stat.S_IMODE(native.previous_handler.stat().st_mode) == 0o600
    saved = handler.read_previous(native)
    assert saved.sysctls == {CORE_PATTERN: SYSTEMD, CORE_PIPE_LIMIT: "0"}
    assert saved.settings is None and saved.sysctl_d is None  # neither file existed
    # Installing again keeps the values from before the first install.
    again = claim(host, native)
    assert again.already_ours and again.replaced is None
    assert handler.read_previous(native) == saved


def test_the_directory_made_for_csplice_conf_goes_with_it(host, tmp_path):
    """A host without a native install has no /var/lib/corehandler: another state dir's install and uninstall
    leave none behind, and neither does a borrow."""
    host.csplice_settings.parent.rmdir()  # not the host's: the fake host starts without that directory
    native = installation(tmp_path, "native")
    claim(host, native, force=True)
    handler.release(host, native)
    assert not host.csplice_settings.parent.exists()
    with handler.borrow(host) as borrowed:
        borrowed.write_settings("spool_dir=/elsewhere\n")
    assert not host.csplice_settings.parent.exists()


def test_another_handler_is_refused_unless_forced(host, tmp_path):
    with pytest.raises(HandlerConflictError, match="systemd-coredump"):
        claim(host, installation(tmp_path, "native"))
    assert kernel(host)[CORE_PATTERN] == SYSTEMD and files(host) == (None, None)


def test_a_second_installation_is_refused_naming_the_first_and_a_forced_one_gives_it_back(host, tmp_path):
    native, second = installation(tmp_path, "native"), installation(tmp_path, "second")
    claim(host, native, force=True)
    native_files = files(host)
    with pytest.raises(HandlerConflictError, match=f"{native.state_dir}.*--force"):
        claim(host, second)
    assert files(host) == native_files and not second.previous_handler.exists()

    claim(host, second, force=True, pattern="|/srv/other/csplice %P")
    assert handler.owns(host, second) and not handler.owns(host, native)
    # The first one's uninstall leaves the host to the second one.
    left = handler.release(host, native)
    assert not left["was_installed"] and left["left_alone"] == "|/srv/other/csplice %P"
    assert handler.owns(host, second)
    # The second one's puts back exactly what it found: the first one's handler, csplice.conf and sysctl.d.
    back = handler.release(host, second)
    assert back["restored"] == {CORE_PATTERN: PATTERN, CORE_PIPE_LIMIT: "16"}
    assert files(host) == native_files and handler.owns(host, native)


def test_an_installation_whose_state_dir_is_gone_is_taken_over_without_force(host, tmp_path):
    gone, new = installation(tmp_path, "gone"), installation(tmp_path, "new")
    claim(host, gone, force=True)
    subprocess.run(["rm", "-rf", str(gone.state_dir)], check=True)
    assert not handler.is_live(handler.owner(host))
    claim(host, new)
    assert handler.owns(host, new)


def test_a_state_dir_made_anew_is_another_installation(host, tmp_path):
    native = installation(tmp_path, "native")
    claim(host, native, force=True)
    native.installation_id.write_text("0123456789abcdef\n")
    assert not handler.owns(host, native)
    assert not handler.refresh(host, native, settings(native, max_pending=3))


def test_refresh_writes_only_for_the_owner(host, tmp_path):
    native, other = installation(tmp_path, "native"), installation(tmp_path, "other")
    claim(host, native, force=True)
    before = files(host)
    assert not handler.refresh(host, other, settings(other, max_pending=3))
    assert files(host) == before
    assert handler.refresh(host, native, settings(native, max_pending=3))
    assert "max_pending=3\n" in host.csplice_settings.read_text()
    # Another handler took over: nobody's daemon writes csplice.conf any more.
    # not the host's: the fake kernel, as apt would
    (host.proc_root / "sys/kernel/core_pattern").write_text(SYSTEMD + "\n")
    assert not handler.refresh(host, native, settings(native, max_pending=4))
    assert "max_pending=3\n" in host.csplice_settings.read_text()


def test_write_settings_refuses_text_naming_another_owner(host, tmp_path):
    native, other = installation(tmp_path, "native"), installation(tmp_path, "other")
    with pytest.raises(ValueError, match="must name the installation"):
        with handler.claim(host, native, force=True) as c:
            c.write_settings(settings(other))


def test_release_without_saved_values_gives_the_kernel_defaults_and_removes_our_files(host, tmp_path):
    native = installation(tmp_path, "native")
    claim(host, native, force=True)
    native.previous_handler.unlink()
    done = handler.release(host, native)
    assert done["restored_from"] == "kernel defaults" and done["sysctl_d_removed"]
    assert kernel(host) == handler.KERNEL_DEFAULTS and files(host) == (None, None)
    assert not handler.release(host, native)["was_installed"]  # nothing of ours left


def test_a_v03_installation_is_recognised_and_released(host, tmp_path):
    """v0.3 wrote csplice.conf without owner keys and saved the sysctls as JSON: its pattern and spool name
    the owner, and the JSON is what uninstall restores."""
    native = installation(tmp_path, "native")
    # not the host's: the fake kernel under tmp_path
    (host.proc_root / "sys/kernel/core_pattern").write_text(PATTERN + "\n")
    # not the host's: the fake kernel under tmp_path
    host.csplice_settings.write_text(f"# Generated by corehandler\nspool_dir={native.spool_dir}\nmax_pending=64\n")
    (native.state_dir / handler.LEGACY_PREVIOUS).write_text(
        '{"kernel.core_pattern": "core", "kernel.core_pipe_limit": "0", "saved_at": 1}')
    assert handler.owner(host) == Owner(str(native.state_dir), None) and handler.owns(host, native)
    assert handler.refresh(host, native, settings(native))
    done = handler.release(host, native)
    assert done["restored"] == {CORE_PATTERN: "core", CORE_PIPE_LIMIT: "0"} and files(host) == (None, None)
    assert not (native.state_dir / handler.LEGACY_PREVIOUS).exists()


def test_a_refused_write_puts_back_what_was_found(host, tmp_path):
    native = installation(tmp_path, "native")
    limit = host.proc_root / "sys/kernel/core_pipe_limit"
    limit.unlink()  # not the host's: the fake kernel under tmp_path
    limit.symlink_to("/dev/null")  # not the host's: a "kernel" that does not keep the value written
    with pytest.raises(SystemFailure, match="was set to '16' but the kernel reports ''"):
        claim(host, native, force=True)
    assert kernel(host)[CORE_PATTERN] == SYSTEMD and files(host) == (None, None)


def test_sysctl_writes_are_one_line_and_name_the_setting(host):
    with handler.borrow(host) as borrowed:
        with pytest.raises(ValueError):
            borrowed.point("a\nb")
        (host.proc_root / "sys/kernel/core_pipe_limit").unlink()  # not the host's: the fake kernel under tmp_path
        with pytest.raises(SystemFailure, match="cannot set kernel.core_pipe_limit to '16'"):
            borrowed.point("core", 16)
        # not the host's: the fake kernel under tmp_path
        (host.proc_root / "sys/kernel/core_pipe_limit").write_text("0\n")


def test_borrow_puts_everything_back_on_any_exit(host, tmp_path):
    native = installation(tmp_path, "native")
    claim(host, native, force=True)
    before = kernel(host), files(host)
    with pytest.raises(RuntimeError):
        with handler.borrow(host, "a test") as borrowed:
            borrowed.point("|/tmp/x/csplice %P", 4)
            borrowed.write_settings("spool_dir=/elsewhere\n")
            sysctl.sysctl_d_file(host.sysctl_d).unlink()  # not the host's: the fake kernel under tmp_path
            raise RuntimeError("the test failed")
    assert (kernel(host), files(host)) == before
    assert sysctl.LOCK_TOKEN_ENV not in os.environ


def test_borrow_puts_back_suid_dumpable_that_a_package_install_changed(host):
    """systemd-coredump's postinst applies its 50-coredump.conf, fs.suid_dumpable=2 with it: a borrower that
    reinstalls it (the package test) leaves the host's value; a fake kernel without the setting is left be."""
    suid = host.proc_root / "sys/fs/suid_dumpable"
    suid.parent.mkdir()
    suid.write_text("0\n")  # not the host's: the fake kernel under tmp_path
    with handler.borrow(host, "a test"):
        suid.write_text("2\n")  # not the host's: the fake kernel under tmp_path
    assert suid.read_text() == "0\n"
    suid.unlink()  # not the host's: the fake kernel under tmp_path
    with handler.borrow(host, "a test"):
        pass
    assert not suid.exists()


def test_the_lock_names_its_holder_and_is_shared_with_children_only(host):
    child = [sys.executable, "-c", "import sys; from pathlib import Path; from corehandler.host import sysctl\n"
             "with sysctl.held_lock(Path(sys.argv[1]), 'child', timeout=0.5): print('held')", str(host.lock)]
    with handler.borrow(host, "the borrower"):
        assert sysctl.holder(host.lock).startswith(f"pid {os.getpid()} (the borrower) since ")
        # A child started meanwhile holds it too (its token is in the environment it inherits) ...
        assert subprocess.run(child, capture_output=True, text=True, check=True).stdout == "held\n"
        # ... and so does this process again; anyone else waits, then hears who holds it.
        with sysctl.held_lock(host.lock, "nested", timeout=0):
            pass
        stranger = {k: v for k, v in os.environ.items() if k != sysctl.LOCK_TOKEN_ENV}
        refused = subprocess.run(child, capture_output=True, text=True, env=stranger)
        assert refused.returncode != 0 and "held by pid" in refused.stderr and "(the borrower)" in refused.stderr
        wrong = {**stranger, sysctl.LOCK_TOKEN_ENV: "0" * 32}
        assert subprocess.run(child, capture_output=True, env=wrong).returncode != 0
    assert sysctl.holder(host.lock) is None
    # The token is spent with the borrow: a child still holding it holds nothing.
    leftover = {**os.environ, sysctl.LOCK_TOKEN_ENV: "spent"}
    assert subprocess.run(child, capture_output=True, text=True, env=leftover).stdout == "held\n"


def test_refresh_gives_up_on_a_lock_held_elsewhere_naming_the_holder(host, tmp_path):
    native = installation(tmp_path, "native")
    claim(host, native, force=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path\n"
                               "from corehandler.host import sysctl\n"
                               "with sysctl.held_lock(Path(sys.argv[1]), 'doctor --probe'):\n"
                               "    print('held', flush=True); time.sleep(30)", str(host.lock)],
                              stdout=subprocess.PIPE, text=True,
                              env={k: v for k, v in os.environ.items() if k != sysctl.LOCK_TOKEN_ENV})
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(sysctl.LockBusy, match=r"\(doctor --probe\)"):
            handler.refresh(host, native, settings(native, max_pending=3), wait=0.2)
    finally:
        holder.kill()
        holder.wait()
    assert handler.refresh(host, native, settings(native, max_pending=3), wait=5)


@pytest.mark.parametrize("text,owner", [
    ("spool_dir=/var/lib/corehandler/spool\nowner=/srv/ch\ninstallation=ab12\n", Owner("/srv/ch", "ab12")),
    ("owner=/srv/ch\n", Owner("/srv/ch", None)),
    ("spool_dir=/var/lib/corehandler/spool\n", Owner("/var/lib/corehandler", None)),
    ("# nothing\nmax_pending=3\n", None),
    ("", None),
])
def test_settings_owner(text, owner):
    assert settings_owner(text) == owner


def test_rendered_settings_name_their_owner_and_refuse_lines_that_would_break_the_file(tmp_path):
    text = render_settings(CaptureConfig(), Path("/s/spool"), FACTS, Owner("/s", "ab12"))
    assert text.endswith("owner=/s\ninstallation=ab12\n") and settings_owner(text) == Owner("/s", "ab12")
    with pytest.raises(ValueError, match="one line"):
        render_settings(CaptureConfig(), Path("/s/spool\nstrategy=splice"), FACTS)
    with pytest.raises(ValueError, match="one line"):
        render_settings(CaptureConfig(), Path("/s/spool"), FACTS, Owner("/s\nspool_dir=/tmp", None))
