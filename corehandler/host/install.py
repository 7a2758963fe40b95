"""`corehandler install`, `uninstall` and `status`: make csplice the kernel's core handler and undo it exactly.

install, as root:
  1. checks csplice: an absolute path whose every component is owned by root and not writable by anyone
     else (the kernel runs it as root: a path others can change is a root shell for them), and that it runs;
  2. refuses when another pipe handler is in core_pattern (systemd-coredump, apport, ...) unless forced;
  3. creates the state directories (owned by root; state and store 0711, spool 0700: paths.DIR_MODES);
  4. saves the current core_pattern and core_pipe_limit in <state>/previous-sysctl.json, unless they are
     already ours: this csplice's, or any csplice's with values saved here (so installing twice keeps the
     values from before the first install);
  5. writes csplice.conf from the config, then the sysctl.d file, then core_pipe_limit and core_pattern live
     (the pattern last: by the time the kernel runs csplice, its settings are in place);
  6. calls start_daemon(paths) when given (the CLI passes the supervisor's start where systemd is absent).
uninstall puts the saved values back, exactly, if the live pattern is still ours, and removes the sysctl.d
file. Dumps in the state directory are left alone.

Modes (install --mode, else [kernel] mode): pipe ("|csplice %P ...", the default), socket ("@@" + the
listener's socket on Linux 6.17+, "@" on 6.16) and auto (socket where the kernel has the handshake and the
listener answers, else pipe). In socket mode the listener is started and seen listening before core_pattern
points at it, since the kernel drops dumps silently when nobody listens. Falling back to pipe mode is decided
here, once: `--mode socket` fails when the listener does not come up, `--mode auto` installs pipe mode then.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Callable

from corehandler import paths as paths_mod
from corehandler.analysis import account
from corehandler.atomicfile import write_atomic
from corehandler.config import Config, write_csplice_settings
from corehandler.csplice_contract import PIDFD_SINCE, PIDFD_SPECIFIER, SPECIFIERS, csplice_version
from corehandler.errors import HandlerConflictError, NotRootError, SystemFailure, UnsafePathError
from corehandler.host import listener, sysctl, writerates
from corehandler.paths import Paths

# The kernel's CORENAME_MAX_SIZE is 128 with the terminating NUL; longer patterns are cut short silently.
MAX_CORE_PATTERN = 127
# Non-zero keeps /proc/PID of a crashed process alive until csplice has read it; 16 concurrent captures.
PIPE_LIMIT = 16
PREVIOUS_FILE = "previous-sysctl.json"
ROOT_UID = 0
# Owners trusted for every component of csplice's path (tests running unprivileged add their own uid).
TRUSTED_UIDS = frozenset({ROOT_UID})
# What uninstall restores when it finds our pattern but no saved values: the kernel's own defaults.
KERNEL_DEFAULTS = {sysctl.CORE_PATTERN: "core", sysctl.CORE_PIPE_LIMIT: "0"}


def _sysctl_root(paths: Paths) -> Path:
    return paths.proc_root / "sys"


kernel_version = listener.kernel_version
MODES = ("pipe", "socket", "auto")
LISTEN_TIMEOUT = 5.0  # the listener must be listening this soon after it was started


def core_pattern_for(csplice: Path, kernel_release: str) -> str:
    pattern = f"|{csplice} {SPECIFIERS}"
    if kernel_version(kernel_release) >= PIDFD_SINCE:
        pattern += f" {PIDFD_SPECIFIER}"
    if len(pattern) > MAX_CORE_PATTERN:
        raise SystemFailure(f"core_pattern would be {len(pattern)} characters, the kernel takes at most "
                            f"{MAX_CORE_PATTERN}: install corehandler under a shorter path than {csplice.parent}")
    if any(c.isspace() for c in str(csplice)):
        raise SystemFailure(f"csplice path {csplice} contains whitespace, which core_pattern cannot quote")
    return pattern


def handler_program(pattern: str) -> str | None:
    """The program of a pipe pattern ("|/usr/lib/x %p" -> "/usr/lib/x"), the socket of a socket pattern
    ("@@/run/x.socket" -> "/run/x.socket"), None for a file pattern."""
    if pattern.startswith("@"):
        return listener.socket_path_of(pattern)
    if not pattern.startswith("|"):
        return None
    words = pattern[1:].split()
    return words[0] if words else ""


def is_ours(pattern: str, socket_path: Path | None = None) -> bool:
    """True for a csplice pipe pattern, whichever installation of corehandler wrote it, or a socket pattern on
    our socket_path (a socket's path is all the pattern says of its server)."""
    if pattern.startswith("@"):
        return socket_path is not None and listener.socket_path_of(pattern) == str(socket_path)
    program = handler_program(pattern)
    return program is not None and Path(program).name == "csplice"


def mode_of(pattern: str) -> str | None:
    """"pipe" or "socket" for our patterns' shapes, None for a file pattern."""
    return "socket" if pattern.startswith("@") else "pipe" if pattern.startswith("|") else None


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


def _previous_path(paths: Paths) -> Path:
    return paths.state_dir / PREVIOUS_FILE


def read_previous(paths: Paths) -> dict | None:
    path = _previous_path(paths)
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise SystemFailure(f"cannot read the saved kernel settings {path}: {e}") from None
    if not all(isinstance(saved.get(name), str) for name in KERNEL_DEFAULTS):
        raise SystemFailure(f"the saved kernel settings {path} lack {' or '.join(KERNEL_DEFAULTS)}")
    return saved


def _live(paths: Paths) -> dict[str, str]:
    return {name: sysctl.read(name, _sysctl_root(paths)) for name in (sysctl.CORE_PATTERN, sysctl.CORE_PIPE_LIMIT)}


def install(config: Config, paths: Paths, *, csplice: Path | None = None, force: bool = False,
            start_daemon: Callable[[Paths], object] | None = None, write_sysctl_d: bool = True,
            mode: str | None = None, start_listener: Callable[[Paths, list[str]], object] | None = None,
            stop_listener: Callable[[Paths], object] | None = None, measure_rates: bool = False,
            persistent: bool = True) -> dict:
    """Makes csplice the live and persistent core handler (see the module docstring); returns what it did.

    persistent=False leaves the sysctl.d directory alone, neither written nor cleaned: the node agent's pod
    (host/agent.py) must not write the host's /etc, and it installs again at every start.

    start_listener(paths, command) runs the socket listener (the CLI passes the supervisor); without it socket
    mode expects something else (systemd's corehandler-capture.socket) to listen on capture.socket_path.
    measure_rates measures the spool filesystem's write rates first (unless a current measurement is saved),
    from which csplice.conf's direct_above is rendered (host/writerates.py)."""
    require_root("install")
    program = check_handler_path(csplice or paths_mod.csplice_path())
    version = csplice_version(program)
    root = _sysctl_root(paths)
    socket_path = config.kernel.socket_path
    mode = mode or config.kernel.mode
    if mode not in MODES:
        raise SystemFailure(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
    pattern = core_pattern_for(program, sysctl.read("kernel.osrelease", root))
    live = _live(paths)
    current = live[sysctl.CORE_PATTERN]
    if handler_program(current) is not None and not is_ours(current, socket_path) and not force:
        raise HandlerConflictError(f"another core handler is installed ({handler_program(current)}): "
                                   f"`corehandler install --force` replaces it and uninstall puts it back")

    ensure_state_dirs(paths)
    try:
        account.ensure()  # the analyser's own user: crashes are unwound as it, never as root
    except OSError as e:
        raise SystemFailure(str(e)) from None
    # Values saved before an earlier install into this state dir are the ones uninstall must restore, even if
    # that install used another csplice path. Another installation's csplice with nothing saved here (a second
    # state dir, scripts/setup's /opt copy) is a handler like any other: saved, so uninstall puts it back.
    already_ours = is_ours(current, socket_path) and (handler_program(current) in (str(program), str(socket_path))
                                                      or _previous_path(paths).exists())
    if not already_ours:
        try:
            write_atomic(_previous_path(paths), json.dumps({**live, "saved_at": time.time()}, indent=1).encode(),
                         0o600)
        except OSError as e:
            raise SystemFailure(f"cannot save the current kernel settings in {_previous_path(paths)}: "
                                f"{e.strerror}") from None
    rates = writerates.refresh(paths) if measure_rates else (writerates.load(paths), None)
    write_csplice_settings(config, paths)
    listening = None
    if mode != "pipe":
        pattern, listening = (_socket_mode(config, paths, program, mode, start_listener, stop_listener)
                              or (pattern, None))
    pipe_limit = str(max(PIPE_LIMIT, _int_or_zero(live[sysctl.CORE_PIPE_LIMIT])))
    values = {sysctl.CORE_PATTERN: pattern, sysctl.CORE_PIPE_LIMIT: pipe_limit}
    # A package ships its own sysctl.d file (/usr/lib/sysctl.d), with the pipe pattern: in pipe mode it is the
    # whole truth (and a file of ours in /etc, left by an earlier socket-mode install, goes). Socket mode needs
    # ours, whose name in /etc overrides the package's, or the next boot gives pipe mode back.
    persist = persistent and (write_sysctl_d or mode_of(pattern) == "socket")
    sysctl_d = sysctl.write_sysctl_d(values, paths.sysctl_d) if persist else None
    if persistent and not persist:
        sysctl.remove_sysctl_d(paths.sysctl_d)
    try:
        sysctl.write(sysctl.CORE_PIPE_LIMIT, pipe_limit, root)
        sysctl.write(sysctl.CORE_PATTERN, pattern, root)
    except SystemFailure:
        # Half installed is the worst state: the next boot would apply what the kernel refused now.
        if not already_ours:
            _restore_quietly(live, root)
            if persist:
                sysctl.remove_sysctl_d(paths.sysctl_d)
        raise
    if start_daemon is not None:
        start_daemon(paths)
    if mode_of(pattern) == "pipe" and stop_listener is not None:
        stop_listener(paths)  # a listener from an earlier socket-mode install serves nobody now
    return {"mode": mode_of(pattern), "listening": listening, "core_pattern": pattern,
            "core_pipe_limit": pipe_limit, "csplice": str(program), "csplice_version": version,
            "replaced": None if already_ours else current, "previous_saved": not already_ours,
            "sysctl_d": None if sysctl_d is None else str(sysctl_d), "settings": str(paths.csplice_settings),
            "state_dir": str(paths.state_dir), "daemon_started": start_daemon is not None,
            "write_rates": {**writerates.describe(rates[0]), "problem": rates[1]}}


def _socket_mode(config: Config, paths: Paths, program: Path, mode: str,
                 start_listener: Callable[[Paths, list[str]], object] | None,
                 stop_listener: Callable[[Paths], object] | None) -> tuple[str, bool] | None:
    """The socket pattern once the listener listens; None when mode auto falls back to pipe mode."""
    prefix = listener.socket_prefix(paths.proc_root)
    socket_path = config.kernel.socket_path
    # auto wants the handshake: plain "@" cannot refuse a dump, which is socket mode's point.
    if prefix is None or (mode == "auto" and prefix != "@@"):
        if mode == "auto":
            return None
        raise SystemFailure(f"this kernel ({sysctl.read('kernel.osrelease', _sysctl_root(paths))}) has no "
                            f"socket core_pattern (Linux 6.16+, with the handshake 6.17+): use --mode pipe")
    if start_listener is not None:
        start_listener(paths, listener.command(program, socket_path, config.kernel.socket_max_connections))
    if not listener.wait_listening(socket_path, LISTEN_TIMEOUT, paths.proc_root):
        if mode == "auto":
            if stop_listener is not None:
                stop_listener(paths)
            return None
        raise SystemFailure(f"nothing listens on {socket_path} (the listener's log is in {paths.log_dir}): "
                            f"core_pattern left as it was; `--mode pipe` works without a listener")
    return listener.socket_pattern(prefix, socket_path), True


def _restore_quietly(values: dict[str, str], root: Path) -> None:
    for name, value in values.items():
        try:
            sysctl.write(name, value, root)
        except SystemFailure:
            pass  # the error being raised already says what failed


def _int_or_zero(text: str) -> int:
    return int(text) if text.strip().isdigit() else 0


def uninstall(paths: Paths, *, stop_daemon: Callable[[Paths], object] | None = None,
              socket_path: Path | None = None, stop_listener: Callable[[Paths], object] | None = None,
              persistent: bool = True) -> dict:
    """Restores the saved core_pattern and core_pipe_limit if ours is live, and removes the sysctl.d file
    (persistent=False: leaves it alone, as install's)."""
    require_root("uninstall")
    root = _sysctl_root(paths)
    previous = read_previous(paths)
    current = sysctl.read(sysctl.CORE_PATTERN, root)
    restored = None
    if is_ours(current, socket_path):
        restored = {name: (previous or KERNEL_DEFAULTS)[name] for name in KERNEL_DEFAULTS}
        # The pattern first: once it is not ours, no new crash reaches csplice.
        sysctl.write(sysctl.CORE_PATTERN, restored[sysctl.CORE_PATTERN], root)
        sysctl.write(sysctl.CORE_PIPE_LIMIT, restored[sysctl.CORE_PIPE_LIMIT], root)
    removed = sysctl.remove_sysctl_d(paths.sysctl_d) if persistent else False
    # Restored, or someone else's handler is live now and must not be overwritten: the saved values are spent.
    _previous_path(paths).unlink(missing_ok=True)
    if stop_daemon is not None:
        stop_daemon(paths)
    # After the pattern: the listener goes only once no new crash can come to it.
    if stop_listener is not None:
        stop_listener(paths)
    return {"was_installed": restored is not None, "restored": restored,
            "restored_from": None if restored is None else ("saved" if previous else "kernel defaults"),
            "left_alone": None if restored is not None else current, "sysctl_d_removed": removed,
            "daemon_stopped": stop_daemon is not None}


# --- status ----------------------------------------------------------------------------------------------


