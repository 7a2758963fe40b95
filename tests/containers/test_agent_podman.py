"""The node agent in a real container runtime: the image build.sh makes, run by podman (runc, cgroupfs) as the
DaemonSet runs it (docs/kubernetes.md): privileged, the init container's `agent install-csplice`, then `agent
run` with the DaemonSet's host paths mounted at the same paths, the ConfigMap's file read-only. Real crashes on
the host and in another container go through the host's kernel into the agent's csplice and its daemon.

The host is the node: its own corehandler (scripts/setup's daemon, state dir) is set aside for each test and put
back afterwards, the host's handler borrowed (tests/support/host_core.py; the agent's container is given the
borrow's token, so its claim and release hold the host lock too), every container removed. The agent is an
installation of its own (agent.STATE_DIR): a native install beside it keeps its store, index and csplice.conf."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from corehandler.csplice_contract import SPECIFIERS, parse_settings
from corehandler.errors import EXIT_CONFLICT
from corehandler.host import agent as agent_mod
from corehandler.host import handler
from corehandler.host.sysctl import LOCK_TOKEN_ENV
from corehandler.paths import DEFAULT_STATE_DIR, Host
from support import host_aside, podman
from support.crash import build_crasher
from support.waiting import wait_for

pytestmark = [pytest.mark.root, pytest.mark.live_kernel, pytest.mark.containers, pytest.mark.slow]

STATE = DEFAULT_STATE_DIR  # a native install's, and the directory of the host's csplice.conf
AGENT_ROOT = Path("/var/lib/corehandler-agent")
LIBEXEC = AGENT_ROOT / "libexec"
AGENT_STATE = agent_mod.STATE_DIR  # the agent's own installation
RUN = Path("/run/corehandler")
CSPLICE = LIBEXEC / "csplice"
OURS = f"|{CSPLICE} {SPECIFIERS}"
BEFORE = {"core_pattern": "core.cht-agent-before", "core_pipe_limit": "3"}
FOREIGN = "|/bin/false cht-agent-foreign %p"
NODE = "cht-node-1"
PYTHON = "/usr/lib/corehandler/bin/python3"
FETCH = ("import sys, urllib.request; "
         "sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:9577/metrics').read().decode())")
BIG_MIB = 192


def sysctl(name: str) -> str:
    return Path("/proc/sys/kernel", name).read_text().removesuffix("\n")


def lock_token() -> list[str]:
    """The borrow's token for a container: its claim and release hold the host lock the test holds."""
    return ["-e", f"{LOCK_TOKEN_ENV}={os.environ[LOCK_TOKEN_ENV]}"]


class Node:
    """This host as a Kubernetes node running the agent's pod."""

    def __init__(self, image: str, work: Path):
        self.image, self.work = image, work
        self.config = work / "corehandler.toml"
        # As the ConfigMap: metrics on every address of the pod's own network namespace.
        self.config.write_text('[metrics]\nlisten = "0.0.0.0"\n[capture]\nmin_free = "0"\nmax_per_exe_per_minute = 0\n')
        self.crasher = build_crasher(work / "bin", static=True)
        self.containers: list[str] = []
        self.serial = 0

    def name(self, what: str) -> str:
        self.serial += 1
        name = f"cht-{what}-{os.getpid()}-{self.serial}"
        self.containers.append(name)
        return name

    def mounts(self) -> list[str]:
        """The DaemonSet's hostPaths: the agent's state dir, the directory of csplice.conf, csplice's directory
        (read-only), /run/corehandler (the host lock) and the ConfigMap's file."""
        return ["-v", f"{AGENT_STATE}:{AGENT_STATE}", "-v", f"{STATE}:{STATE}", "-v", f"{LIBEXEC}:{LIBEXEC}:ro",
                "-v", f"{RUN}:{RUN}", "-v", f"{self.config}:/etc/corehandler/corehandler.toml:ro", *lock_token()]

    def install_csplice(self) -> subprocess.CompletedProcess:
        """The init container, with the DaemonSet's securityContext: not privileged, a read-only root, only the
        capabilities to own and replace the host's copy."""
        return podman.podman("run", "--rm", "--read-only", "--cap-drop", "all", "--cap-add",
                             "CHOWN,DAC_OVERRIDE,FOWNER", "--security-opt", "no-new-privileges", "--network", "none",
                             "-v", f"{LIBEXEC}:{LIBEXEC}", self.image, "agent", "install-csplice",
                             "--dir", str(LIBEXEC))

    def agent_args(self, env: dict[str, str]) -> list[str]:
        # No host network (the DaemonSet's pod has its own): the metrics are read from inside, as the probe does.
        return ["--privileged", "--network", "none", *self.mounts(), "-e", f"NODE_NAME={NODE}",
                *(a for k, v in env.items() for a in ("-e", f"{k}={v}")), self.image, "agent", "run"]

    def start_agent(self, **env: str) -> str:
        """`agent run` detached, once its metrics answer (the pod's readiness probe)."""
        name = self.name("agent")
        podman.podman("run", "-d", "--name", name, *self.agent_args(env))
        wait_for(lambda: self.ready(name), timeout=120, what="the agent's metrics")
        return name

    def ready(self, name: str) -> bool:
        if not podman.inspect(name)["State"]["Running"]:
            raise AssertionError(f"the agent exited:\n{podman.podman('logs', name, check=False).stderr}")
        return self.metrics(name, check=False) is not None

    def metrics(self, name: str, check: bool = True) -> str | None:
        """GET /metrics on port 9577 (the readiness probe's httpGet), from inside the pod."""
        got = podman.podman("exec", name, PYTHON, "-c", FETCH, check=check)
        return got.stdout if got.returncode == 0 else None

    @staticmethod
    def cli() -> list[str]:
        """The CLI in the pod, on the agent's installation (its default state dir is a native install's)."""
        return ["corehandler", "--state-dir", str(AGENT_STATE)]

    def dumps(self, agent: str) -> list[dict]:
        """`corehandler list` in the pod; [] until there is an index with dumps (exit 1: nothing matched)."""
        got = podman.podman("exec", agent, *self.cli(), "--json=short", "list", check=False)
        return json.loads(got.stdout) if got.returncode == 0 and got.stdout.strip() else []

    def info(self, agent: str, dump_id: str) -> dict:
        (found,) = json.loads(podman.podman("exec", agent, *self.cli(), "--json=short", "info", dump_id).stdout)
        return found

    def dump_of(self, agent: str, pid: int, status: str = "ok") -> dict:
        def found():
            rows = [d for d in self.dumps(agent) if d["pid"] == pid]
            return rows if rows and all(d["status"] == status for d in rows) else None
        rows = wait_for(found, timeout=300, interval=0.5, what=f"the dump of {pid} {status}")
        assert len(rows) == 1, rows
        return rows[0]

    def crash_on_host(self, mib: int = 1) -> int:
        """The pid of a host process that crashed with mib MiB of memory to dump."""
        proc = subprocess.Popen([str(self.crasher), "segv", str(mib)], stdout=subprocess.DEVNULL,
                                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (-1, -1)))
        assert proc.wait(timeout=300) == -signal.SIGSEGV
        return proc.pid

    def crash_in_container(self, annotations: dict[str, str] | None = None) -> tuple[str, str]:
        """(container id, name) of a container whose process crashed (another image's container, here the same
        image with the static crasher mounted). annotations: its bundle's, as a CRI runtime writes a pod's
        (sandbox name and namespace; the pod's corehandler.io/core where the runtime passes it)."""
        name = self.name("victim")
        notes = [a for k, v in (annotations or {}).items() for a in ("--annotation", f"{k}={v}")]
        podman.podman("run", "--name", name, "--network", "none", "--ulimit", "host", *notes,
                      "-v", f"{self.crasher.parent}:/t:ro", "--entrypoint", "/bin/sh", self.image,
                      "-c", f"/t/{self.crasher.name} segv 1; exit 0", dumps=True)
        return podman.inspect(name)["Id"], name


@pytest.fixture(scope="module")
def host_daemon_stopped():
    """The host's own daemon stopped once for the module: stopped again right after each test's restart, it was
    killed while starting, its csplice.conf's temp file left behind."""
    with host_aside.host_daemon_stopped():
        yield


@pytest.fixture
def node(host_daemon_stopped, host_core_settings, agent_image, tmp_path):
    image, _, _ = agent_image
    with host_aside.paths_aside([STATE, AGENT_ROOT], "agent-test"):
        node = Node(image, tmp_path)
        try:
            host_core_settings.point(BEFORE["core_pattern"], BEFORE["core_pipe_limit"])
            node.lent = host_core_settings
            for d in (AGENT_STATE, STATE, LIBEXEC, RUN):  # the DaemonSet's hostPath type DirectoryOrCreate
                d.mkdir(mode=0o755, parents=True, exist_ok=True)
            node.install_csplice()
            yield node
        finally:
            podman.remove(*node.containers)
            shutil.rmtree(STATE, ignore_errors=True)
            shutil.rmtree(AGENT_ROOT, ignore_errors=True)


def test_the_image_holds_a_static_csplice_and_says_its_size(agent_image):
    _, archive, line = agent_image
    assert "MiB unpacked" in line and str(archive) in line, line
    print(line)


def test_install_csplice_puts_a_static_root_only_csplice_on_the_host(node):
    st = os.stat(CSPLICE)
    assert (st.st_uid, stat.S_IMODE(st.st_mode), stat.S_IMODE(os.stat(LIBEXEC).st_mode)) == (0, 0o755, 0o755)
    ldd = subprocess.run(["ldd", str(CSPLICE)], capture_output=True, text=True)
    assert ldd.returncode != 0 and "not a dynamic executable" in ldd.stdout + ldd.stderr
    again = node.install_csplice()
    assert "already in place" in again.stdout


def test_crashes_on_the_host_and_in_a_container_are_captured_attributed_and_a_stop_restores(node):
    # As the kubelet starts every container: the agent logs JSON lines, a line per crash with its fields.
    agent = node.start_agent(KUBERNETES_SERVICE_HOST="10.96.0.1")
    assert sysctl("core_pattern").startswith(OURS) and sysctl("core_pipe_limit") == "16"
    host_pid = node.crash_on_host()
    container_id, victim = node.crash_in_container()
    on_host = node.dump_of(agent, host_pid)
    in_container = wait_for(lambda: [d for d in node.dumps(agent) if d["id"] != on_host["id"]
                                     and d["status"] == "ok"], timeout=300, what="the container's dump")
    assert len(in_container) == 1, in_container
    host_info, victim_info = node.info(agent, on_host["id"]), node.info(agent, in_container[0]["id"])
    assert host_info["record"]["proc"]["container"] is None
    found = victim_info["record"]["proc"]["container"]
    assert (found["id"], found["runtime"]) == (container_id, "podman"), found
    assert host_info["record"]["hostname"] == socket.gethostname()
    metrics = node.metrics(agent)
    assert 'corehandler_dumps_total{' in metrics
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith("corehandler_dumps_total{") and 'outcome="complete"' in line)
    assert counted == 2, metrics
    podman.podman("stop", "--time", "60", agent)
    assert podman.inspect(agent)["State"]["ExitCode"] == 0
    assert {name: sysctl(name) for name in BEFORE} == BEFORE
    entries = [json.loads(line) for line in podman.podman("logs", agent).stderr.splitlines()]  # each one JSON
    assert any("Put back core_pattern = core.cht-agent-before" in e["message"] for e in entries)
    crashes = {e["dump_id"]: e for e in entries if e["logger"] == "corehandler.crash"}
    assert set(crashes) == {on_host["id"], in_container[0]["id"]}, crashes
    assert all(e["node"] == NODE and e["signal_name"] and e["exe"] and e["time"].endswith("Z")
               for e in crashes.values()), crashes
    assert crashes[in_container[0]["id"]]["container_id"] == container_id
    assert "container_id" not in crashes[on_host["id"]]


def test_a_pods_opt_out_keeps_nothing_its_namespace_metadata_and_each_crash_logs_its_pod_as_json(node):
    """Three pods' containers crash: one as the default keeps (full), one that opted out with its annotation
    (none: no record, counted), one in a namespace the chart keeps metadata of. The agent's JSON log has a line
    for each dump it kept, naming pod, namespace, container, node, exe, signal and the policy."""
    node.config.write_text(node.config.read_text() + '[kubernetes]\nmetadata_namespaces = ["payments"]\n')
    agent = node.start_agent(KUBERNETES_SERVICE_HOST="10.96.0.1")
    pod = {"io.kubernetes.cri.sandbox-namespace": "shop", "io.kubernetes.cri.sandbox-name": "cart-0",
           "io.kubernetes.cri.container-name": "cart"}
    kept, _ = node.crash_in_container(pod)
    node.crash_in_container({**pod, "io.kubernetes.cri.sandbox-name": "quiet-0", "corehandler.io/core": "none"})
    paid, _ = node.crash_in_container({**pod, "io.kubernetes.cri.sandbox-namespace": "payments"})

    def excluded() -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in node.metrics(agent).splitlines()
                   if line.startswith('corehandler_crashes_excluded_total{source="annotation"}'))

    rows = wait_for(lambda: (lambda d: d if len(d) == 2 and {r["status"] for r in d} == {"ok", "dropped"}
                             and excluded() == 1 else None)(node.dumps(agent)), timeout=300,
                    what="the kept dump, the metadata-only one and the excluded crash counted")
    by_status = {r["status"]: node.info(agent, r["id"]) for r in rows}
    assert by_status["ok"]["record"]["proc"]["container"]["id"] == kept
    assert by_status["ok"]["record"]["kubernetes"] == {"core": "full", "core_source": "default"}
    dropped = by_status["dropped"]["record"]
    assert dropped["proc"]["container"]["id"] == paid and dropped["core"] is None
    assert (dropped["capture"]["dropped_reason"], dropped["kubernetes"]["core_source"]) == ("pod_policy", "namespace")
    podman.podman("stop", "--time", "60", agent)
    entries = [json.loads(line) for line in podman.podman("logs", agent).stderr.splitlines()]  # each one JSON
    crashes = [e for e in entries if e["logger"] == "corehandler.crash"]
    assert all(e["node"] == NODE and e["pod_name"] == "cart-0" and e["container_name"] == "cart" and e["exe"]
               and e["signal_name"] == "SIGSEGV" and e["time"].endswith("Z") and e["level"] == "info"
               for e in crashes), crashes
    assert sorted((e["pod_namespace"], e["core_policy"], e["status"]) for e in crashes) == [
        ("payments", "metadata", "dropped"), ("shop", "full", "ok")], crashes
    assert not any("quiet-0" in json.dumps(e) for e in entries)


def test_a_kill_mid_dump_and_crashes_while_the_agent_is_down_lose_nothing(node):
    agent = node.start_agent(COREHANDLER_TEST_PAUSE_AT="compressing")
    big = node.crash_on_host(BIG_MIB)
    node.dump_of(agent, big, status="compressing")  # the daemon holds it there, mid-store
    podman.podman("kill", "--signal", "KILL", agent)
    assert sysctl("core_pattern").startswith(OURS)  # nothing ran to take csplice out
    small = node.crash_on_host()
    wait_for(lambda: any(p.name.endswith(f"-{small}.json") for p in (AGENT_STATE / "spool").iterdir()),
             what="csplice's record of the crash while the agent was down")
    agent = node.start_agent()
    first, second = node.dump_of(agent, big), node.dump_of(agent, small)
    assert first["raw_bytes"] > BIG_MIB << 20 and first["status"] == second["status"] == "ok"
    assert len(node.dumps(agent)) == 2
    podman.podman("stop", "--time", "60", agent)
    assert {name: sysctl(name) for name in BEFORE} == BEFORE


def test_another_handler_is_refused_unless_forced(node):
    node.lent.point(FOREIGN, BEFORE["core_pipe_limit"])
    refused = podman.podman("run", "--rm", *node.agent_args({}), check=False)
    assert refused.returncode == EXIT_CONFLICT, refused
    said = refused.stderr.strip().splitlines()[-1]
    assert said.startswith("corehandler: another core handler (/bin/false) captures this node's crashes: the agent "
                           "replaces it with --force (COREHANDLER_AGENT_FORCE=1"), refused.stderr
    assert sysctl("core_pattern") == FOREIGN
    agent = node.start_agent(COREHANDLER_AGENT_FORCE="1")
    assert sysctl("core_pattern").startswith(OURS)
    podman.podman("stop", "--time", "60", agent)
    assert sysctl("core_pattern") == FOREIGN and sysctl("core_pipe_limit") == BEFORE["core_pipe_limit"]


def test_keep_on_stop_leaves_capture_on_until_agent_uninstall(node):
    agent = node.start_agent(COREHANDLER_AGENT_KEEP_ON_STOP="1")
    podman.podman("stop", "--time", "60", agent)
    assert sysctl("core_pattern").startswith(OURS)
    done = podman.podman("run", "--rm", "--privileged", "--network", "none", "-v", f"{AGENT_STATE}:{AGENT_STATE}",
                         "-v", f"{STATE}:{STATE}", "-v", f"{LIBEXEC}:{LIBEXEC}", "-v", f"{RUN}:{RUN}", *lock_token(),
                         node.image, "agent", "uninstall")
    assert "the agent uninstalled: core_pattern = core.cht-agent-before" in done.stdout, done
    assert {name: sysctl(name) for name in BEFORE} == BEFORE and not CSPLICE.exists()


def tree(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, tuple[str, int]]:
    """Every file under root: its sha256 and mtime (ns)."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and path not in skip:
            found[str(path)] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    return found


def test_the_agent_forced_over_a_native_install_leaves_it_untouched(node, tmp_path):
    """A native corehandler owns the host's handler, with a dump in its store: the agent refuses to start over
    it, naming it; forced, it captures into its own state dir; stopped, it gives the handler back to the native
    install, whose store, index and csplice.conf it never touched."""
    etc = tmp_path / "native-etc"
    etc.mkdir()
    (etc / "corehandler.toml").write_text('[capture]\nmin_free = "0"\nmax_per_exe_per_minute = 0\n'
                                          '[metrics]\nenabled = false\n[journal]\nenabled = false\n')
    native = [sys.executable, "-P", "-m", "corehandler", "--config-dir", str(etc), "--state-dir", str(STATE)]

    def cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(native + list(argv), capture_output=True, text=True, timeout=120)

    done = cli("install", "--force", "--no-daemon")
    assert done.returncode == 0, done.stderr
    native_pattern = sysctl("core_pattern")
    native_pid = node.crash_on_host()
    daemon = subprocess.Popen(native + ["serve", "--sweep-interval", "1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: [d for d in json.loads(cli("--json", "list").stdout or "[]")
                          if d["pid"] == native_pid and d["status"] == "ok"], timeout=120,
                 what="the native install's dump in its store")
    finally:
        daemon.terminate()
        assert daemon.wait(60) == 0, daemon.stderr.read()
    settings = Host().csplice_settings
    assert parse_settings(settings.read_text())["owner"] == str(STATE)
    assert (STATE / "index.sqlite").exists() and any((STATE / "store").rglob("*"))
    before = tree(STATE, skip=(settings,))
    settings_before = settings.read_bytes()

    refused = podman.podman("run", "--rm", *node.agent_args({}), check=False)
    assert refused.returncode == EXIT_CONFLICT, refused
    assert f"the installation in {STATE}" in refused.stderr and "COREHANDLER_AGENT_FORCE=1" in refused.stderr, \
        refused.stderr
    assert sysctl("core_pattern") == native_pattern and settings.read_bytes() == settings_before

    agent = node.start_agent(COREHANDLER_AGENT_FORCE="1")
    assert sysctl("core_pattern").startswith(OURS)
    assert parse_settings(settings.read_text())["owner"] == str(AGENT_STATE)
    agent_pid = node.crash_on_host()
    node.dump_of(agent, agent_pid)
    assert (AGENT_STATE / "index.sqlite").exists()
    # In the pod, status says that the agent's daemon runs and its installation captures.
    status = json.loads(podman.podman("exec", agent, *node.cli(), "--json", "status").stdout)
    assert status["daemon"]["state"] == "running" and status["capture"]["this"] is True, status
    podman.podman("stop", "--time", "60", agent)
    assert podman.inspect(agent)["State"]["ExitCode"] == 0

    # The native install captures again, exactly as before; nothing of its state changed.
    assert sysctl("core_pattern") == native_pattern
    assert settings.read_bytes() == settings_before  # rewritten by the release, byte for byte
    assert handler.owner(Host()).state_dir == str(STATE)
    assert tree(STATE, skip=(settings,)) == before
    assert [d["pid"] for d in json.loads(cli("--json", "list").stdout)] == [native_pid]
    done = cli("uninstall")
    assert done.returncode == 0, done.stderr
    assert sysctl("core_pattern") == BEFORE["core_pattern"]
