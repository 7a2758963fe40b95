"""install --mode socket|auto, uninstall and status in socket mode, against a fake host (tests/local/fakehost.py).

The listener is a callback here: it "listens" by adding the socket's line to the fake /proc/net/unix, the file
corehandler reads to tell whether anything listens (tests/system/test_socket_live.py runs the real one).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fakehost import FakeHost

from corehandler.cli.install import _listener_line
from corehandler.config import Config
from corehandler.errors import HandlerConflictError, SystemFailure
from corehandler.host import handler, install, listener, overview
from corehandler.observe.metrics import MetricsObserver

SOCKET = Path("/run/corehandler/capture/coredump.socket")
HEADER = "Num       RefCount Protocol Flags    Type St Inode Path\n"


@pytest.fixture
def host(tmp_path, csplice, monkeypatch):
    short = Path(tempfile.mkdtemp(prefix="ch-"))
    host = FakeHost(tmp_path, csplice, monkeypatch, bin_dir=short)
    host.set("core_modes", "file pipe socket")
    (host.machine.proc_root / "net").mkdir()
    (host.machine.proc_root / "net" / "unix").write_text(HEADER)
    yield host
    shutil.rmtree(short)


class FakeListener:
    def __init__(self, host: FakeHost, answers: bool = True):
        self.host, self.answers = host, answers
        self.started: list[list[str]] = []
        self.stopped = 0

    def start(self, paths, command: list[str]) -> None:
        self.started.append(command)
        if self.answers:
            self.listen(command[2])

    def listen(self, path: str, flags: str = "00010000", state: str = "01") -> None:
        with open(self.host.machine.proc_root / "net" / "unix", "a") as f:
            f.write(f"0000000012345678: 00000002 00000000 {flags} 0001 {state} 18185 {path}\n")

    def gone(self) -> None:
        (self.host.machine.proc_root / "net" / "unix").write_text(HEADER)

    def stop(self, paths) -> None:
        self.stopped += 1
        self.gone()


def test_socket_mode_installed_by_hand_survives_the_packages_reinstall_on_upgrade(host):
    """postinst runs `install --package` on every upgrade, without --mode: socket mode chosen on the command line
    stays socket mode (it came back as pipe mode unless the config said socket). A config that sets [kernel]
    mode, and --mode, still decide."""
    fake = FakeListener(host)
    ours = host.machine.sysctl_d / "50-corehandler.conf"
    package = {"host": host.machine, "csplice": host.csplice, "start_listener": fake.start,
               "stop_listener": fake.stop, "write_sysctl_d": False, "force": True}
    install.install(Config(), host.paths, mode="socket", **package)
    assert host.paths.install_mode.read_text() == "socket\n"
    fake.stop(host.paths)  # the upgrade: prerm stops things, the new package's postinst installs again
    done = install.install(Config(), host.paths, **package)
    assert done["mode"] == "socket" and host.get("core_pattern") == f"@@{SOCKET}" and ours.exists()
    assert len(fake.started) == 2

    config_says_pipe = Config.model_validate({"kernel": {"mode": "pipe"}})
    assert install.install(config_says_pipe, host.paths, **package)["mode"] == "pipe" and not ours.exists()
    assert install.install(Config(), host.paths, **package)["mode"] == "pipe"  # what was last asked for
    assert install.install(Config(), host.paths, mode="socket", **package)["mode"] == "socket"


def test_socket_patterns_are_ours_only_on_our_socket():
    assert handler.is_corehandler(f"@@{SOCKET}", SOCKET) and handler.is_corehandler(f"@{SOCKET}", SOCKET)
    assert not handler.is_corehandler("@@/run/systemd/coredump", SOCKET)
    assert not handler.is_corehandler(f"@@{SOCKET}")  # without our socket path nobody can tell
    assert handler.handler_program("@@/run/systemd/coredump") == "/run/systemd/coredump"
    assert handler.mode_of(f"@@{SOCKET}") == "socket" and handler.mode_of("|/x/csplice") == "pipe"
    assert handler.mode_of("core") is None


@pytest.mark.parametrize("release, modes, prefix", [("6.18.44", "file pipe socket", "@@"), ("6.17.0", "", "@@"),
                                                    ("6.16.3", "file pipe socket", "@"), ("6.15.0", "", None),
                                                    ("6.18.0", "file pipe", None)])
def test_socket_prefix_by_kernel(host, release, modes, prefix):
    host.set("osrelease", release)
    if modes:
        host.set("core_modes", modes)
    else:
        (host.kernel / "core_modes").unlink()
    assert listener.socket_prefix(host.machine.proc_root) == prefix


def test_install_socket_mode_starts_the_listener_first_then_uninstall(host):
    fake = FakeListener(host)
    done = install.install(Config(), host.paths, host=host.machine, csplice=host.csplice, mode="socket",
                           start_listener=fake.start,
                           stop_listener=fake.stop)
    assert fake.started == [[str(host.csplice), "--listen", str(SOCKET), "--max-connections", "16"]]
    assert host.get("core_pattern") == f"@@{SOCKET}" == done["core_pattern"]
    assert done["mode"] == "socket" and done["listening"] is True and fake.stopped == 0

    st = overview.status(Config(), host.paths, host=host.machine, csplice=host.csplice)
    assert st["installed"] and st["mode"] == "socket" and st["core_pattern_matches"]
    assert st["listener"]["listening"] is True and st["listener"]["socket_path"] == str(SOCKET)
    assert overview.capture_state(Config(), host.paths, host.machine) == {"mode": "socket", "listening": True,
                                  "refused_peers": 0, "stalled": 0, "displaced": False, "shed": {}}

    fake.gone()  # the listener died: the kernel now drops dumps silently, and status must say so
    assert overview.status(Config(), host.paths, host=host.machine,
                           csplice=host.csplice)["listener"]["listening"] is False
    assert overview.capture_state(Config(), host.paths, host.machine)["listening"] is False

    done = install.uninstall(host.paths, host=host.machine, socket_path=SOCKET, stop_listener=fake.stop)
    assert done["was_installed"] and host.get("core_pattern") == "core" and fake.stopped == 1


def test_packaged_socket_mode_survives_a_reboot_and_pipe_mode_gives_the_package_its_file_back(host):
    """The package ships the pipe pattern in /usr/lib/sysctl.d (install --package writes no sysctl.d file of
    its own): socket mode writes ours, whose name in /etc overrides the package's at boot, and a later pipe-mode
    install removes it again."""
    fake = FakeListener(host)
    ours = host.machine.sysctl_d / "50-corehandler.conf"
    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice, mode="socket",
                    start_listener=fake.start,
                    stop_listener=fake.stop, write_sysctl_d=False)
    assert f"kernel.core_pattern = @@{SOCKET}\n" in ours.read_text()
    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice, mode="pipe", stop_listener=fake.stop,
                    write_sysctl_d=False)
    assert host.get("core_pattern").startswith(f"|{host.csplice} ") and not ours.exists()


def test_socket_mode_fails_and_leaves_the_pattern_when_nothing_listens(host, monkeypatch):
    monkeypatch.setattr(install, "LISTEN_TIMEOUT", 0.2)
    fake = FakeListener(host, answers=False)
    with pytest.raises(SystemFailure, match=f"nothing listens on {SOCKET}.*core_pattern left as it was"):
        install.install(Config(), host.paths, host=host.machine, csplice=host.csplice, mode="socket",
                        start_listener=fake.start,
                        stop_listener=fake.stop)
    assert host.get("core_pattern") == "core"


def test_a_socket_that_is_not_listening_does_not_count(host, monkeypatch):
    """A bound socket nobody listens on (no __SO_ACCEPTCON), or one of another path, is not a listener."""
    fake = FakeListener(host, answers=False)
    fake.listen(str(SOCKET), flags="00000000", state="03")
    fake.listen(str(SOCKET) + ".other")
    assert not listener.listening(SOCKET, host.machine.proc_root)
    fake.listen(str(SOCKET))
    assert listener.listening(SOCKET, host.machine.proc_root)


@pytest.mark.parametrize("release, answers", [("6.18.44", False), ("6.16.0", True)])
def test_auto_falls_back_to_pipe_mode(host, monkeypatch, release, answers):
    """auto: socket only with the handshake (6.17+) and a listener that answers; else pipe mode, at once."""
    monkeypatch.setattr(install, "LISTEN_TIMEOUT", 0.2)
    host.set("osrelease", release)
    fake = FakeListener(host, answers=answers)
    done = install.install(Config(), host.paths, host=host.machine, csplice=host.csplice, mode="auto",
                           start_listener=fake.start,
                           stop_listener=fake.stop)
    assert done["mode"] == "pipe" and host.get("core_pattern").startswith(f"|{host.csplice} ")
    assert fake.stopped >= 1  # no listener left running for nobody


def test_socket_mode_needs_a_socket_kernel(host):
    host.set("osrelease", "6.1.0-26-amd64")
    (host.kernel / "core_modes").unlink()
    with pytest.raises(SystemFailure, match="no socket core_pattern.*--mode pipe"):
        install.install(Config(), host.paths, host=host.machine, csplice=host.csplice, mode="socket")
    assert host.get("core_pattern") == "core"


def test_another_socket_handler_is_a_conflict(host):
    host.set("core_pattern", "@@/run/systemd/coredump")
    with pytest.raises(HandlerConflictError, match=r"another core handler is installed \(/run/systemd/coredump\)"):
        install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    assert host.get("core_pattern") == "@@/run/systemd/coredump"


def test_status_cli_says_loudly_when_nothing_listens(host):
    fake = FakeListener(host)
    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice, mode="socket",
                    start_listener=fake.start)
    fake.gone()
    line = _listener_line(overview.status(Config(), host.paths, host=host.machine, csplice=host.csplice)["listener"])
    assert "NOT LISTENING" in line and "DROPS EVERY DUMP SILENTLY" in line


@pytest.mark.parametrize("state, up", [({"mode": "socket", "listening": True, "refused_peers": 2}, "1.0"),
                                       ({"mode": "socket", "listening": False, "refused_peers": 0}, "0.0"),
                                       ({"mode": "pipe", "listening": False, "refused_peers": 0}, None)])
def test_metrics_show_the_mode_and_the_listener(state, up):
    observer = MetricsObserver(capture_probe=lambda: state)
    text = observer.exposition().decode()
    assert f'corehandler_capture_mode{{mode="{state["mode"]}"}} 1.0' in text
    if up is None:
        assert "corehandler_listener_up" not in text  # pipe mode: nothing to alert on
    else:
        assert f"corehandler_listener_up {up}" in text
    assert f"corehandler_socket_refused_peers_total {float(state['refused_peers'])}" in text


def test_metrics_count_socket_rejects_by_reason():
    observer = MetricsObserver()
    record = {"signal": 11, "capture": {"mode": "socket", "dropped": True, "dropped_reason": "rlimit_core",
                                        "socket": {"rejected": True}}}
    observer.on_ingested(record, {"status": "ok"})
    observer.on_ingested({**record, "capture": {**record["capture"], "socket": {"rejected": False}}}, {"status": "ok"})
    text = observer.exposition().decode()
    assert 'corehandler_socket_rejects_total{reason="rlimit_core"} 1.0' in text


def test_cli_install_help_lists_the_modes():
    out = subprocess.run([sys.executable, "-m", "corehandler", "install", "--help"], capture_output=True, text=True)
    assert "--mode {pipe,socket,auto}" in out.stdout
