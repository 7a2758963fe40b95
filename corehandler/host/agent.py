"""The node agent's life cycle in a privileged pod (`corehandler agent`, docs/kubernetes.md).

The agent is an installation of its own (STATE_DIR, not a native install's /var/lib/corehandler): its own
spool, store, index and daemon lock. The pod shares four host paths with the node, each mounted at the same
path inside (so a path in core_pattern, csplice.conf or the index means the same on both sides): its state dir,
the directory the kernel runs csplice from (LIBEXEC_DIR), the directory of csplice.conf (fixed in csplice, and
the host's: paths.CSPLICE_SETTINGS) and /run/corehandler (the host lock). Its /proc/sys is the host's:
core_pattern is not namespaced.

- install-csplice (the init container): copies the image's static csplice (the node's libc is not the image's)
  into LIBEXEC_DIR, atomically, root's and 0755, so that the main container can mount it read-only.
- run (the main container): install.install in pipe mode with nothing persisted (no sysctl.d: a pod must not
  write the host's /etc, and it installs again at every start): a claim of the host's handler, which refuses
  a live native installation unless forced. Then `serve` in the foreground. A stop it was asked for (SIGTERM,
  SIGINT) releases the handler: exactly what the claim found goes back, csplice.conf included, unless
  keep_on_stop; a failure leaves the pattern, so csplice keeps spooling into the agent's state dir until the
  restarted agent ingests it (as after SIGKILL or OOM, where nothing runs at all).
- uninstall (a Job, a Helm hook): the release, and the host's csplice copy removed.

Pipe mode only: a socket listener would live in the pod, and the kernel drops dumps while it restarts.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from corehandler.atomicfile import write_atomic
from corehandler.config import Config
from corehandler.csplice_contract import csplice_version
from corehandler.errors import HandlerConflictError, SystemFailure
from corehandler.host import handler, install, sysctl
from corehandler.paths import Host, Paths, libexec_dir

log = logging.getLogger("corehandler.agent")

# The hostPath the kernel runs csplice from (docs/kubernetes.md): read-only in the main container.
LIBEXEC_DIR = Path("/var/lib/corehandler-agent/libexec")
# The agent's own installation: a native corehandler on the node keeps /var/lib/corehandler to itself.
STATE_DIR = Path("/var/lib/corehandler-agent/state")
# The other host paths of the pod, each mounted at the same path.
RUN_DIR = Paths().run_dir
CONFIG_FILE = Paths().config_file  # the ConfigMap's, read-only
# The image's csplice for the host, linked statically (packaging/kubernetes/image/build.sh puts it here).
STATIC_CSPLICE = "csplice-static"
ENV_FORCE = "COREHANDLER_AGENT_FORCE"
ENV_KEEP_ON_STOP = "COREHANDLER_AGENT_KEEP_ON_STOP"
# The Kubernetes node's name (the DaemonSet sets it from spec.nodeName): the host's name in the bucket.
ENV_NODE_NAME = "NODE_NAME"
JOURNAL_SOCKET = Path("/run/systemd/journal/socket")


def static_csplice() -> Path:
    return libexec_dir() / STATIC_CSPLICE


def env_flag(name: str, env: Mapping[str, str] = os.environ) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes")


def node_config(config: Config, env: Mapping[str, str] = os.environ, journal_socket: Path = JOURNAL_SOCKET) -> Config:
    """The config as the agent runs it: the node's name in the bucket unless upload.host names one, and no
    journald entries where the host's journal socket is not mounted into the pod (the log on stderr has a
    line per dump)."""
    node = env.get(ENV_NODE_NAME, "").strip()
    if node and not config.upload.host:
        config = config.model_copy(update={"upload": config.upload.model_copy(update={"host": node})})
    if config.journal.enabled and not journal_socket.exists():
        config = config.model_copy(update={"journal": config.journal.model_copy(update={"enabled": False})})
    return config


def install_csplice(directory: Path, source: Path | None = None) -> dict:
    """Puts a copy of source (default: the image's static csplice) at directory/csplice: root's, 0755, the
    directory root's and 0755, the whole path writable by root alone. The copy replaces the file by rename,
    so a csplice the kernel runs at that moment keeps its own; the same bytes already there are left as they
    are."""
    source = source or static_csplice()
    try:
        data = source.read_bytes()
    except OSError as e:
        raise SystemFailure(f"cannot read the csplice to install, {source}: {e.strerror}") from None
    target = directory / "csplice"
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chown(directory, install.ROOT_UID, install.ROOT_UID)
        os.chmod(directory, 0o755)
        unchanged = _same_file(target, data)
        if not unchanged:
            write_atomic(target, data, 0o755)
    except OSError as e:
        raise SystemFailure(f"cannot install csplice in {directory}: {e.strerror}") from None
    real = install.check_handler_path(target)
    return {"csplice": str(real), "version": csplice_version(real), "source": str(source), "unchanged": unchanged}


def _same_file(target: Path, data: bytes) -> bool:
    try:
        st = os.lstat(target)
        return (stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755 and st.st_uid == install.ROOT_UID
                and target.read_bytes() == data)
    except FileNotFoundError:
        return False


def start(config: Config, paths: Paths, csplice: Path, *, force: bool = False, host: Host = Host()) -> dict:
    """csplice (LIBEXEC_DIR's) into core_pattern, live only, this installation its owner; what the host had is
    saved unless the agent owns the handler already (a restart). Refuses another handler, a live native
    corehandler on the node included, unless forced."""
    program = install.check_handler_path(csplice)
    if config.kernel.mode != "pipe":
        log.warning("[kernel] mode = %s is ignored: the agent installs pipe mode, which needs no process of the "
                    "pod to capture", config.kernel.mode)
    try:
        return install.install(config, paths, host=host, csplice=program, force=force, mode="pipe",
                               write_sysctl_d=False, persistent=False, what="agent")
    except handler.HandlerTaken as e:
        # install's advice is for a shell on the host; the agent's is its own switch.
        raise HandlerConflictError(f"{e.who} captures this node's crashes: the agent replaces it with --force "
                                   f"({ENV_FORCE}=1, forceReplace in the chart) and puts it back when stopped"
                                   ) from None


def stop(paths: Paths, host: Host = Host()) -> dict:
    """The handler released: what start found goes back exactly, csplice.conf included, if the agent still owns
    it (the node's own corehandler, or whatever an admin installed since, is left alone)."""
    return install.uninstall(paths, host=host, persistent=False)


def remove_csplice(directory: Path) -> bool:
    try:
        (directory / "csplice").unlink()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise SystemFailure(f"cannot remove {directory / 'csplice'}: {e.strerror}") from None
    return True


@dataclasses.dataclass(frozen=True)
class Options:
    csplice: Path
    force: bool = False
    keep_on_stop: bool = False


def run(config: Config, paths: Paths, options: Options, serve: Callable[[], int], host: Host = Host()) -> int:
    """start, then serve() (the daemon in the foreground, 0 once a stop was asked for); then the previous handler
    back unless keep_on_stop. serve() raising leaves csplice in core_pattern: capture goes on without us."""
    done = start(config, paths, options.csplice, force=options.force, host=host)
    replaced = f"; replaced {done['replaced']!r}" if done["replaced"] is not None else ""
    log.info("Installed: core_pattern = %s, core_pipe_limit = %s%s", done["core_pattern"], done["core_pipe_limit"],
             replaced)
    code = serve()
    if code != 0 or options.keep_on_stop:
        log.info("Leaving core_pattern to csplice, which keeps capturing into %s", paths.spool_dir)
        return code
    put_back = stop(paths, host)
    if put_back["restored"] is not None:
        log.info("Put back core_pattern = %s, core_pipe_limit = %s (from %s)",
                 put_back["restored"][sysctl.CORE_PATTERN], put_back["restored"][sysctl.CORE_PIPE_LIMIT],
                 put_back["restored_from"])
    else:
        log.warning("The agent no longer owns the host's handler (core_pattern is %r): left alone",
                    put_back["left_alone"])
    return code
