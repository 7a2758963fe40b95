"""`corehandler install`, `uninstall` and `status`: make csplice the kernel's core handler and undo it exactly.

install, as root:
  1. checks csplice: an absolute path whose every component is owned by root and not writable by anyone
     else (the kernel runs it as root: a path others can change is a root shell for them), and that it runs;
  2. creates the state directories (owned by root; state and store 0711, spool 0700: paths.DIR_MODES);
  3. claims the host's handler (host/handler.py, under the host lock): refuses another pipe handler in
     core_pattern (systemd-coredump, apport, ...) and another live installation's csplice unless forced,
     saves what the host had once, then writes csplice.conf naming this installation, the sysctl.d file, and
     core_pipe_limit and core_pattern live (the pattern last: by the time the kernel runs csplice, its
     settings are in place);
  4. calls start_daemon(paths) when given (the CLI passes the supervisor's start where systemd is absent).
uninstall releases the handler: what the claim found goes back exactly, if this installation still owns it.
Dumps in the state directory are left alone.

Modes (install --mode, else [kernel] mode): pipe ("|csplice %P ...", the default), socket ("@@" + the
listener's socket on Linux 6.17+, "@" on 6.16) and auto (socket where the kernel has the handshake and the
listener answers, else pipe). In socket mode the listener is started and seen listening before core_pattern
points at it, since the kernel drops dumps silently when nobody listens. Falling back to pipe mode is decided
here, once: `--mode socket` fails when the listener does not come up, `--mode auto` installs pipe mode then.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable

from corehandler import paths as paths_mod
from corehandler.analysis import account
from corehandler.atomicfile import write_atomic
from corehandler.config import Config
from corehandler.csplice_contract import PIDFD_SPECIFIER, SPECIFIERS, csplice_version
from corehandler.errors import NotRootError, SystemFailure, UnsafePathError
from corehandler.host import handler, listener, sysctl, writerates
from corehandler.host.handler import mode_of
from corehandler.paths import Host, Paths

# The kernel's CORENAME_MAX_SIZE is 128 with the terminating NUL; longer patterns are cut short silently.
MAX_CORE_PATTERN = 127
# Non-zero keeps /proc/PID of a crashed process alive until csplice has read it; 16 concurrent captures.
PIPE_LIMIT = 16
ROOT_UID = 0
# Owners trusted for every component of csplice's path (tests running unprivileged add their own uid).
TRUSTED_UIDS = frozenset({ROOT_UID})
MODES = ("pipe", "socket", "auto")
LISTEN_TIMEOUT = 5.0  # the listener must be listening this soon after it was started


def core_pattern_for(csplice: Path) -> str:
    """The same on every kernel, as the package's sysctl.d file has it (csplice_contract.PIDFD_SPECIFIER)."""
    pattern = f"|{csplice} {SPECIFIERS} {PIDFD_SPECIFIER}"
    if len(pattern) > MAX_CORE_PATTERN:
        raise SystemFailure(f"core_pattern would be {len(pattern)} characters, the kernel takes at most "
                            f"{MAX_CORE_PATTERN}: install corehandler under a shorter path than {csplice.parent}")
    if any(c.isspace() for c in str(csplice)):
        raise SystemFailure(f"csplice path {csplice} contains whitespace, which core_pattern cannot quote")
    return pattern


def check_handler_path(path: Path) -> Path:
    """The real path of csplice, after checking that only root can change what the kernel will run there."""
    if not path.is_absolute():
        raise UnsafePathError(f"csplice path {path} is not absolute")
    real = Path(os.path.realpath(path))
    try:
        st = real.stat()
    except OSError as e:
        raise SystemFailure(f"csplice not found at {real}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode) or not st.st_mode & stat.S_IXUSR:
        raise UnsafePathError(f"csplice at {real} is not an executable file")
    check_root_only(real, "csplice", "the kernel runs csplice as root")
    return real


def check_root_only(real: Path, what: str, why: str) -> None:
    """Raises UnsafePathError unless root owns `real` (a resolved path) and every directory above it, and none
    is writable by group or others (a sticky directory aside): only root can change what root will run."""
    for part in [real, *real.parents]:
        st = part.stat()
        if st.st_uid not in TRUSTED_UIDS:
            raise UnsafePathError(f"refusing {what} at {real}: {part} is owned by uid {st.st_uid}, not root, "
                                  f"and {why}")
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_dir:
            raise UnsafePathError(f"refusing {what} at {real}: {part} is writable by group or others "
                                  f"(mode {stat.S_IMODE(st.st_mode):04o}), and {why}")


def require_root(verb: str) -> None:
    if os.geteuid() != ROOT_UID:
        raise NotRootError(f"{verb} changes kernel settings and needs root (run it with sudo)")


def ensure_state_dirs(paths: Paths) -> None:
    """state, spool and store directories: root's, with paths.DIR_MODES, whatever they were before."""
    for kind, directory in (("state", paths.state_dir), ("spool", paths.spool_dir), ("store", paths.store_dir)):
        mode = paths_mod.DIR_MODES[kind]
        try:
            directory.mkdir(mode=mode, parents=True, exist_ok=True)
            st = os.lstat(directory)
            if not stat.S_ISDIR(st.st_mode):
                raise SystemFailure(f"{directory} exists and is not a directory")
            if st.st_uid != ROOT_UID:
                os.chown(directory, ROOT_UID, ROOT_UID)
            os.chmod(directory, mode)
        except OSError as e:
            raise SystemFailure(f"cannot create {directory}: {e.strerror}") from None


def install(config: Config, paths: Paths, *, host: Host = Host(), csplice: Path | None = None, force: bool = False,
            start_daemon: Callable[[Paths], object] | None = None, write_sysctl_d: bool = True,
            mode: str | None = None, start_listener: Callable[[Paths, list[str]], object] | None = None,
            stop_listener: Callable[[Paths], object] | None = None, measure_rates: bool = False,
            persistent: bool = True, what: str = "install") -> dict:
    """Makes csplice the live and persistent core handler, this installation its owner (see the module
    docstring); returns what it did.

    persistent=False leaves the sysctl.d directory alone, neither written nor cleaned: the node agent's pod
    (host/agent.py) must not write the host's /etc, and it installs again at every start.

    start_listener(paths, command) runs the socket listener (the CLI passes the supervisor); without it socket
    mode expects something else (systemd's corehandler-capture.socket) to listen on capture.socket_path.
    measure_rates measures the spool filesystem's write rates first (unless a current measurement is saved),
    from which csplice.conf's direct_above is rendered (host/writerates.py)."""
    require_root("install")
    program = check_handler_path(csplice or paths_mod.csplice_path())
    version = csplice_version(program)
    socket_path = config.kernel.socket_path
    mode = requested_mode(config, paths, mode)
    if mode not in MODES:
        raise SystemFailure(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
    pattern = core_pattern_for(program)
    handler.check_claim(host, paths, force=force, socket_path=socket_path)  # before anything is made
    ensure_state_dirs(paths)
    try:
        account.ensure()  # the analyser's own user: crashes are unwound as it, never as root
    except OSError as e:
        raise SystemFailure(str(e)) from None
    rates = writerates.refresh(paths, proc_root=host.proc_root) if measure_rates else (writerates.load(paths), None)
    with handler.claim(host, paths, force=force, socket_path=socket_path, what=what) as claim:
        claim.write_settings(handler.settings_for(config.capture, paths, host))
        listening = None
        if mode != "pipe":
            pattern, listening = (_socket_mode(config, paths, host, program, mode, start_listener, stop_listener)
                                  or (pattern, None))
        found_limit = claim.found.sysctls[sysctl.CORE_PIPE_LIMIT]
        pipe_limit = str(max(PIPE_LIMIT, _int_or_zero(found_limit)))
        values = {sysctl.CORE_PATTERN: pattern, sysctl.CORE_PIPE_LIMIT: pipe_limit}
        # A package ships its own sysctl.d file (/usr/lib/sysctl.d), with the pipe pattern: in pipe mode it is
        # the whole truth (and a file of ours in /etc, left by an earlier socket-mode install, goes). Socket mode
        # needs ours, whose name in /etc overrides the package's, or the next boot gives pipe mode back.
        persist = (write_sysctl_d or mode_of(pattern) == "socket") if persistent else None
        sysctl_d = claim.point(values, persist=persist)
        _remember_mode(paths, mode)
    if start_daemon is not None:
        start_daemon(paths)
    if mode_of(pattern) == "pipe" and stop_listener is not None:
        stop_listener(paths)  # a listener from an earlier socket-mode install serves nobody now
    return {"mode": mode_of(pattern), "listening": listening, "core_pattern": pattern,
            "core_pipe_limit": pipe_limit, "csplice": str(program), "csplice_version": version,
            "replaced": claim.replaced, "previous_saved": claim.saves_previous,
            "sysctl_d": None if sysctl_d is None else str(sysctl_d), "settings": str(host.csplice_settings),
            "state_dir": str(paths.state_dir), "installation": claim.me.installation,
            "daemon_started": start_daemon is not None,
            "write_rates": {**writerates.describe(rates[0]), "problem": rates[1]}}


def requested_mode(config: Config, paths: Paths, given: str | None) -> str:
    """The mode to install: --mode, else [kernel] mode where a config file sets it, else the one the last
    install was asked for, else the default. The package's postinst installs again on every upgrade without
    --mode: socket mode chosen on the command line must survive it, not fall back to the default pipe."""
    if given is not None:
        return given
    if "mode" in config.kernel.model_fields_set:
        return config.kernel.mode
    try:
        remembered = paths.install_mode.read_text().strip()
    except FileNotFoundError:
        remembered = None
    except OSError as e:
        raise SystemFailure(f"cannot read {paths.install_mode}: {e.strerror}") from None
    return remembered if remembered in MODES else config.kernel.mode


def _remember_mode(paths: Paths, mode: str) -> None:
    try:
        write_atomic(paths.install_mode, f"{mode}\n".encode(), 0o644)
    except OSError as e:
        raise SystemFailure(f"cannot write {paths.install_mode}: {e.strerror}") from None


def _socket_mode(config: Config, paths: Paths, host: Host, program: Path, mode: str,
                 start_listener: Callable[[Paths, list[str]], object] | None,
                 stop_listener: Callable[[Paths], object] | None) -> tuple[str, bool] | None:
    """The socket pattern once the listener listens; None when mode auto falls back to pipe mode."""
    prefix = listener.socket_prefix(host.proc_root)
    socket_path = config.kernel.socket_path
    # auto wants the handshake: plain "@" cannot refuse a dump, which is socket mode's point.
    if prefix is None or (mode == "auto" and prefix != "@@"):
        if mode == "auto":
            return None
        raise SystemFailure(f"this kernel ({sysctl.read('kernel.osrelease', host.sysctl_root)}) has no "
                            f"socket core_pattern (Linux 6.16+, with the handshake 6.17+): use --mode pipe")
    if start_listener is not None:
        start_listener(paths, listener.command(program, socket_path, config.kernel.socket_max_connections))
    if not listener.wait_listening(socket_path, LISTEN_TIMEOUT, host.proc_root):
        if mode == "auto":
            if stop_listener is not None:
                stop_listener(paths)
            return None
        raise SystemFailure(f"nothing listens on {socket_path} (the listener's log is in {paths.log_dir}): "
                            f"core_pattern left as it was; `--mode pipe` works without a listener")
    return listener.socket_pattern(prefix, socket_path), True


def _int_or_zero(text: str) -> int:
    return int(text) if text.strip().isdigit() else 0


def uninstall(paths: Paths, *, host: Host = Host(), stop_daemon: Callable[[Paths], object] | None = None,
              socket_path: Path | None = None, stop_listener: Callable[[Paths], object] | None = None,
              persistent: bool = True) -> dict:
    """Releases the handler (host/handler.py): what install found goes back exactly if this installation still
    owns it, otherwise the host is left alone; then the daemon and the listener stop."""
    require_root("uninstall")
    done = handler.release(host, paths, socket_path=socket_path, persistent=persistent)
    if stop_daemon is not None:
        stop_daemon(paths)
    # After the pattern: the listener goes only once no new crash can come to it.
    if stop_listener is not None:
        stop_listener(paths)
    return {**done, "daemon_stopped": stop_daemon is not None}
