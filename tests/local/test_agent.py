"""The node agent's life cycle (host/agent.py, `corehandler agent`) against a fake host (tests/local/fakehost.py):
the host's csplice copy, the pattern installed live only, refusals, what a stop, a failure and a restart leave.
The same life cycle in a real privileged container: tests/containers/test_agent_podman.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from fakehost import SYSTEMD_PATTERN, FakeHost

from corehandler import cli
from corehandler.config import Config
from corehandler.csplice_contract import SPECIFIERS
from corehandler.errors import EXIT_CONFLICT, HandlerConflictError, SystemFailure
from corehandler.host import agent, handler, install, sysctl

NATIVE_PATTERN = f"|/usr/libexec/corehandler/csplice {SPECIFIERS}"


@pytest.fixture
def host(tmp_path, csplice, monkeypatch, short_dir) -> FakeHost:
    host = FakeHost(tmp_path, csplice, monkeypatch, bin_dir=short_dir)
    # What the host had in sysctl.d before the agent came: the pod must neither write nor clean it.
    host.machine.sysctl_d.mkdir(parents=True)
    sysctl.sysctl_d_file(host.machine.sysctl_d).write_text("# the host's own\n")  # not the host's: the fake host's
    return host


@pytest.fixture
def agent_csplice(host, short_dir) -> Path:
    done = agent.install_csplice(short_dir / "agent" / "libexec", host.csplice)
    return Path(done["csplice"])


def mine(host: FakeHost):
    """The agent's own installation on the fake host (agent.STATE_DIR's stand-in)."""
    return host.installation("agent")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def sysctl_d_untouched(host: FakeHost) -> bool:
    return [p.name for p in host.machine.sysctl_d.iterdir()] == [sysctl.SYSCTL_D_NAME] and \
        sysctl.sysctl_d_file(host.machine.sysctl_d).read_text() == "# the host's own\n"


def serving(host: FakeHost, code: int = 0, seen: list | None = None):
    """A stand-in for the daemon: notes the pattern it ran under, then stops with code."""
    def serve() -> int:
        if seen is not None:
            seen.append(host.get("core_pattern"))
        return code
    return serve


def crashing(host: FakeHost, seen: list):
    def serve() -> int:
        seen.append(host.get("core_pattern"))
        raise SystemFailure("the daemon failed")
    return serve


def test_install_csplice_copies_it_root_only_and_again_is_a_no_op(host, short_dir):
    directory = short_dir / "a" / "libexec"
    done = agent.install_csplice(directory, host.csplice)
    target = directory / "csplice"
    assert done["csplice"] == str(target) and not done["unchanged"] and done["version"]
    assert target.read_bytes() == host.csplice.read_bytes()
    assert (mode(target), mode(directory)) == (0o755, 0o755)
    assert os.stat(target).st_uid == install.ROOT_UID
    assert [p.name for p in directory.iterdir()] == ["csplice"]  # no temp file left
    inode = os.stat(target).st_ino
    again = agent.install_csplice(directory, host.csplice)
    assert again["unchanged"] and os.stat(target).st_ino == inode


def test_install_csplice_replaces_by_rename_and_tightens_the_directory(host, short_dir):
    directory = short_dir / "libexec"
    directory.mkdir(mode=0o777)
    os.chmod(directory, 0o777)
    (directory / "csplice").write_bytes(b"an older csplice")
    os.chmod(directory / "csplice", 0o777)
    with open(directory / "csplice", "rb") as running:  # what the kernel runs at this moment keeps its bytes
        done = agent.install_csplice(directory, host.csplice)
        assert running.read() == b"an older csplice"
    assert not done["unchanged"] and mode(directory) == 0o755 and mode(directory / "csplice") == 0o755
    assert (directory / "csplice").read_bytes() == host.csplice.read_bytes()


def test_install_csplice_without_a_source_says_which(short_dir):
    with pytest.raises(SystemFailure, match=f"cannot read the csplice to install, {short_dir}/nope"):
        agent.install_csplice(short_dir / "libexec", short_dir / "nope")
    assert not (short_dir / "libexec").exists()


def test_run_installs_live_only_and_a_stop_puts_the_previous_handler_back(host, agent_csplice):
    host.set("core_pattern", "/var/crash/core.%p")
    host.set("core_pipe_limit", "3")
    seen: list = []
    code = agent.run(Config(), mine(host), agent.Options(agent_csplice), serving(host, 0, seen), host.machine)
    assert code == 0
    assert seen == [f"|{agent_csplice} {SPECIFIERS} %F"]
    assert (host.get("core_pattern"), host.get("core_pipe_limit")) == ("/var/crash/core.%p", "3")
    assert sysctl_d_untouched(host)
    assert not mine(host).previous_handler.exists()


def test_another_handler_is_refused_unless_forced(host, agent_csplice):
    host.set("core_pattern", SYSTEMD_PATTERN)
    with pytest.raises(HandlerConflictError, match=r"^another core handler \(/lib/systemd/systemd-coredump\) "
                                                   r"captures this node's crashes: the agent replaces it with "
                                                   r"--force \(COREHANDLER_AGENT_FORCE=1, forceReplace") as err:
        agent.run(Config(), mine(host), agent.Options(agent_csplice), serving(host), host.machine)
    assert err.value.exit_code == EXIT_CONFLICT
    assert host.get("core_pattern") == SYSTEMD_PATTERN and not mine(host).state_dir.exists()
    seen: list = []
    agent.run(Config(), mine(host), agent.Options(agent_csplice, force=True), serving(host, 0, seen), host.machine)
    assert seen[0].startswith(f"|{agent_csplice} ")
    assert (host.get("core_pattern"), host.get("core_pipe_limit")) == (SYSTEMD_PATTERN, "0")


def test_the_nodes_own_corehandler_is_refused_unless_forced_and_a_stop_gives_it_back_untouched(host, agent_csplice):
    """A native install (its own state dir, its csplice.conf) on the node: the agent is refused naming it; forced,
    the agent captures into its own installation, and its stop leaves the native store, index and csplice.conf
    as they were, the native pattern live again."""
    install.install(Config(), host.paths, host=host.machine, csplice=host.csplice)
    (host.paths.store_dir / "a-dump.zst").write_bytes(b"native dump")
    (host.paths.index_path).write_bytes(b"native index")
    native = host.get("core_pattern")

    def state() -> dict:
        # The store and index as they were, to the nanosecond; csplice.conf, which the agent's claim replaced,
        # byte for byte.
        files = {str(f): (f.read_bytes() if f.is_file() else None, f.stat().st_mtime_ns)
                 for f in sorted(host.paths.state_dir.rglob("*")) if f != host.machine.csplice_settings}
        return {**files, "csplice.conf": host.machine.csplice_settings.read_bytes(),
                "sysctl.d": sysctl.sysctl_d_file(host.machine.sysctl_d).read_bytes()}

    before = state()
    with pytest.raises(HandlerConflictError, match=f"^the installation in {host.paths.state_dir}, installation "
                                                   f"{handler.installation_id(host.paths)} \\("):
        agent.start(Config(), mine(host), agent_csplice, host=host.machine)
    assert host.get("core_pattern") == native and state() == before
    seen: list = []
    agent.run(Config(), mine(host), agent.Options(agent_csplice, force=True), serving(host, 0, seen), host.machine)
    assert seen == [f"|{agent_csplice} {SPECIFIERS} %F"]
    assert host.get("core_pattern") == native and state() == before
    assert handler.owns(host.machine, host.paths)


def test_a_failed_daemon_leaves_csplice_capturing_and_a_restart_does_not_remember_itself(host, agent_csplice):
    host.set("core_pattern", SYSTEMD_PATTERN)
    ours = f"|{agent_csplice} {SPECIFIERS} %F"
    seen: list = []
    with pytest.raises(SystemFailure, match="the daemon failed"):
        agent.run(Config(), mine(host), agent.Options(agent_csplice, force=True), crashing(host, seen), host.machine)
    assert host.get("core_pattern") == ours  # as after SIGKILL: csplice keeps spooling
    saved = handler.read_previous(mine(host)).sysctls
    # The restarted agent needs no --force for its own pattern, and keeps what it saved the first time.
    agent.run(Config(), mine(host), agent.Options(agent_csplice), serving(host, 0, seen), host.machine)
    assert seen == [ours, ours]
    assert (host.get("core_pattern"), host.get("core_pipe_limit")) == (saved["kernel.core_pattern"], "0")
    assert saved["kernel.core_pattern"] == SYSTEMD_PATTERN
    assert sysctl_d_untouched(host)


def test_keep_on_stop_leaves_the_pattern_until_uninstall(host, agent_csplice):
    ours = f"|{agent_csplice} {SPECIFIERS} %F"
    agent.run(Config(), mine(host), agent.Options(agent_csplice, keep_on_stop=True), serving(host), host.machine)
    assert host.get("core_pattern") == ours
    done = agent.stop(mine(host), host.machine)
    assert done["restored"] == {"kernel.core_pattern": "core", "kernel.core_pipe_limit": "0"}
    assert host.get("core_pattern") == "core" and sysctl_d_untouched(host)


def test_a_stop_leaves_a_handler_installed_since_alone(host, agent_csplice):
    def replaced() -> int:
        host.set("core_pattern", SYSTEMD_PATTERN)
        return 0
    agent.run(Config(), mine(host), agent.Options(agent_csplice), replaced, host.machine)
    assert host.get("core_pattern") == SYSTEMD_PATTERN and host.get("core_pipe_limit") == "16"


def test_socket_mode_in_the_config_installs_pipe_mode(host, agent_csplice):
    done = agent.start(Config.model_validate({"kernel": {"mode": "socket"}}), mine(host), agent_csplice,
                       host=host.machine)
    assert done["mode"] == "pipe" and host.get("core_pattern").startswith("|")


def test_node_config_names_the_node_and_turns_the_journal_off_without_its_socket(tmp_path):
    config = agent.node_config(Config(), {"NODE_NAME": "worker-3.example"}, tmp_path / "absent")
    assert config.upload.host == "worker-3.example" and not config.journal.enabled
    named = Config.model_validate({"upload": {"host": "chosen"}})
    assert agent.node_config(named, {"NODE_NAME": "worker-3"}, tmp_path / "absent").upload.host == "chosen"
    (tmp_path / "socket").touch()
    config = agent.node_config(Config(), {}, tmp_path / "socket")
    assert config.upload.host == "" and config.journal.enabled


def test_the_cli_installs_csplice_and_uninstall_removes_it(host, short_dir, capsys, monkeypatch):
    directory = short_dir / "cli" / "libexec"
    args = ["--state-dir", str(mine(host).state_dir), "--json=short", "agent"]
    assert cli.main(args + ["install-csplice", "--dir", str(directory), "--csplice", str(host.csplice)]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["csplice"] == str(directory / "csplice") and not done["unchanged"]
    agent.start(Config(), mine(host), directory / "csplice", host=host.machine)
    # The CLI reads the live /proc/sys; the fake host's stands in for it.
    monkeypatch.setattr(cli.agent, "load", lambda a: (Config(), mine(host)))
    real_stop = agent.stop
    monkeypatch.setattr(agent, "stop", lambda paths: real_stop(paths, host.machine))
    assert cli.main(args + ["uninstall", "--dir", str(directory)]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["restored"] == {"kernel.core_pattern": "core", "kernel.core_pipe_limit": "0"}
    assert done["csplice_removed"] and not (directory / "csplice").exists()
    assert host.get("core_pattern") == "core"
