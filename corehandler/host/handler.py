"""The host's crash handler and its one writer: kernel.core_pattern, kernel.core_pipe_limit, our sysctl.d file
and csplice.conf exist once per machine, whatever the number of installations (state dirs) on it. Nothing
else in corehandler writes them, and every write here happens under the host lock (sysctl.held_lock).

Four verbs:
- claim (install, the node agent's start): this installation becomes the handler. What the host had before
  is saved once, in one place (the installation's previous-handler.conf), unless this installation already
  owns the handler. Another live installation's handler is refused unless forced, naming it.
- refresh (a daemon's start, reload and write-rate refresh): csplice.conf re-rendered, only if this
  installation owns the handler; a daemon of another state dir never changes what the kernel does.
- release (uninstall, the agent's stop): exactly what was saved goes back, if this installation still owns
  the handler; otherwise everything is left as it is.
- borrow (doctor --probe, the tests, the benchmarks): the lock, then everything restored on every exit path.

Who owns the handler, the one rule (owner()): the live core_pattern is corehandler's (a csplice pipe pattern
or a socket pattern on our socket) and csplice.conf names the installation: `owner=STATE_DIR` and
`installation=ID`; in a file v0.3 wrote, the parent of its `spool_dir`; with no file (or one naming neither),
csplice.conf's own directory, where csplice's built-in spool is. An installation is this one when the state
dirs match and so do the ids, where csplice.conf names one. debian/corehandler.postrm says the same in shell,
and tests/local/test_debian_rule.py holds the two to the same answers.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from corehandler.atomicfile import write_atomic
from corehandler.csplice_contract import Facts, Owner, choose_strategy, render_settings, settings_owner
from corehandler.errors import HandlerConflictError, SystemFailure
from corehandler.host import listener, sysctl, writerates
from corehandler.host.sysctl import CORE_PATTERN, CORE_PIPE_LIMIT, SUID_DUMPABLE
from corehandler.paths import Host, Paths

NAMES = (CORE_PATTERN, CORE_PIPE_LIMIT)
# What release restores when it finds our pattern but nothing saved: the kernel's own defaults.
KERNEL_DEFAULTS = {CORE_PATTERN: "core", CORE_PIPE_LIMIT: "0"}
# The saved csplice.conf and sysctl.d file, in previous-handler.conf beside the sysctls.
SETTINGS_KEY = "corehandler.csplice_conf"
SYSCTL_D_KEY = "corehandler.sysctl_d"
SETTINGS_DIR_KEY = "corehandler.csplice_conf_dir"
ABSENT = "absent"
# v0.3 saved the sysctls alone, as JSON: read when previous-handler.conf is missing.
LEGACY_PREVIOUS = "previous-sysctl.json"
# A daemon's refresh waits this long for a lock someone else holds (doctor --probe, a test) and then leaves
# csplice.conf as it is: the next reload or rate refresh tries again; ingest never waits on it.
REFRESH_WAIT = 10.0


# --- reading: who owns the handler -------------------------------------------------------------------------

def handler_program(pattern: str) -> str | None:
    """The program of a pipe pattern ("|/usr/lib/x %p" -> "/usr/lib/x"), the socket of a socket pattern
    ("@@/run/x.socket" -> "/run/x.socket"), None for a file pattern."""
    if pattern.startswith("@"):
        return listener.socket_path_of(pattern)
    if not pattern.startswith("|"):
        return None
    words = pattern[1:].split()
    return words[0] if words else ""


def is_corehandler(pattern: str, socket_path: Path | None = None) -> bool:
    """True for a csplice pipe pattern, whichever installation wrote it, or a socket pattern on socket_path (a
    socket's path is all the pattern says of its server)."""
    if pattern.startswith("@"):
        return socket_path is not None and listener.socket_path_of(pattern) == str(socket_path)
    program = handler_program(pattern)
    return program is not None and Path(program).name == "csplice"


def mode_of(pattern: str) -> str | None:
    """"pipe" or "socket" for our patterns' shapes, None for a file pattern."""
    return "socket" if pattern.startswith("@") else "pipe" if pattern.startswith("|") else None


def live(host: Host) -> dict[str, str]:
    return {name: sysctl.read(name, host.sysctl_root) for name in NAMES}


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SystemFailure(f"cannot read {path}: {e.strerror}") from None


def settings_owner_of(host: Host) -> Owner:
    """The installation csplice.conf names. A file that is missing or names neither owner nor spool leaves
    csplice on its built-in spool (csplice/settings.c), the default state dir's, where csplice.conf lives."""
    data = _read_bytes(host.csplice_settings)
    found = None if data is None else settings_owner(data.decode(errors="replace"))
    return found or Owner(str(host.csplice_settings.parent), None)


def owner(host: Host, socket_path: Path | None = None) -> Owner | None:
    """The installation that captures this host's crashes now: None when the live pattern is not corehandler's
    (another handler, a file pattern)."""
    if not is_corehandler(sysctl.read(CORE_PATTERN, host.sysctl_root), socket_path):
        return None
    return settings_owner_of(host)


def installation_id(paths: Paths) -> str | None:
    try:
        text = paths.installation_id.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SystemFailure(f"cannot read {paths.installation_id}: {e.strerror}") from None
    return text or None


def this_installation(paths: Paths, create: bool = False) -> Owner:
    """This installation as csplice.conf names it; create makes its id on the first claim."""
    ident = installation_id(paths)
    if ident is None and create:
        ident = secrets.token_hex(8)
        try:
            write_atomic(paths.installation_id, (ident + "\n").encode(), 0o644)
        except OSError as e:
            raise SystemFailure(f"cannot write {paths.installation_id}: {e.strerror}") from None
    return Owner(str(paths.state_dir), ident)


def is_me(found: Owner | None, paths: Paths) -> bool:
    """found names this installation: its state dir and, where it names one, its id (a state dir removed and
    made anew is another installation)."""
    if found is None or os.path.normpath(found.state_dir) != os.path.normpath(str(paths.state_dir)):
        return False
    return found.installation is None or found.installation == installation_id(paths)


def owns(host: Host, paths: Paths, socket_path: Path | None = None) -> bool:
    return is_me(owner(host, socket_path), paths)


def displaced(host: Host, paths: Paths, socket_path: Path | None = None) -> bool:
    """The kernel runs another handler although csplice.conf names this installation as the owner: nobody
    released it (uninstall would have), so another package took it (systemd-coredump's postinst re-applies its
    pattern on every systemd update)."""
    if is_corehandler(sysctl.read(CORE_PATTERN, host.sysctl_root), socket_path):
        return False
    data = _read_bytes(host.csplice_settings)
    return data is not None and is_me(settings_owner(data.decode(errors="replace")), paths)


def is_live(found: Owner) -> bool:
    """Whether the installation found still exists: its state dir, holding the id csplice.conf names."""
    state = Paths(state_dir=Path(found.state_dir))
    try:
        if not state.state_dir.is_dir():
            return False
        return found.installation is None or installation_id(state) == found.installation
    except (OSError, SystemFailure):
        return False


def facts(host: Host, paths: Paths) -> Facts:
    """What this host measured, for the settings a config leaves at auto."""
    choice = writerates.choose(writerates.load(paths))
    return Facts(choose_strategy(host.proc_root), choice.direct_above, choice.direct_rate)


def settings_for(capture, paths: Paths, host: Host) -> str:
    """csplice.conf as paths' installation renders it: capture (the config's [capture]) on this host's facts,
    with this installation as its owner."""
    return render_settings(capture, paths.spool_dir, facts(host, paths), this_installation(paths))


# --- what was there before -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Previous:
    """What the host had before an installation claimed it. settings and sysctl_d: the files' bytes, None
    where they were absent (or not known: a v0.3 record); settings_dir: whether csplice.conf's directory was
    there (the default state dir: a host without a native install has none, and keeps none)."""
    sysctls: dict[str, str]
    settings: bytes | None
    sysctl_d: bytes | None
    saved_at: float | None = None
    settings_dir: bool = True


def _encode(data: bytes | None) -> str:
    return ABSENT if data is None else base64.b64encode(data).decode()


def _decode(text: str | None) -> bytes | None:
    return None if text in (None, ABSENT) else base64.b64decode(text, validate=True)


def _render_previous(previous: Previous) -> bytes:
    # sysctl.d's form, so that debian/corehandler.postrm (shell, run when the Python side is gone) reads it too.
    lines = ["# What the host had before corehandler claimed its core handler; `corehandler uninstall` puts it",
             f"# back. Saved at {time.strftime('%Y-%m-%d %H:%M:%S %z', time.localtime(previous.saved_at))}."]
    lines += [f"{name} = {previous.sysctls[name]}" for name in NAMES]
    lines += [f"{SETTINGS_KEY} = {_encode(previous.settings)}", f"{SYSCTL_D_KEY} = {_encode(previous.sysctl_d)}",
              f"{SETTINGS_DIR_KEY} = {'present' if previous.settings_dir else ABSENT}"]
    return ("\n".join(lines) + "\n").encode()


def _parse_previous(text: str) -> dict[str, str]:
    # Not sysctl.d's parser, which strips: a pattern's trailing spaces are part of it.
    values = {}
    for line in text.splitlines():
        name, sep, value = line.partition(" = ")
        if sep and not name.startswith(("#", ";")):
            values[name] = value
    return values


def read_previous(paths: Paths) -> Previous | None:
    path = paths.previous_handler
    try:
        values = _parse_previous(path.read_text())
    except FileNotFoundError:
        return _read_legacy_previous(paths)
    except (OSError, ValueError) as e:
        raise SystemFailure(f"cannot read the saved handler {path}: {e}") from None
    if not all(name in values for name in NAMES):
        raise SystemFailure(f"the saved handler {path} lacks {' or '.join(NAMES)}")
    try:
        return Previous({name: values[name] for name in NAMES}, _decode(values.get(SETTINGS_KEY)),
                        _decode(values.get(SYSCTL_D_KEY)), path.stat().st_mtime,
                        values.get(SETTINGS_DIR_KEY) != ABSENT)
    except ValueError as e:
        raise SystemFailure(f"the saved handler {path} is damaged: {e}") from None


def _read_legacy_previous(paths: Paths) -> Previous | None:
    path = paths.state_dir / LEGACY_PREVIOUS
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise SystemFailure(f"cannot read the saved kernel settings {path}: {e}") from None
    if not isinstance(saved, dict) or not all(isinstance(saved.get(name), str) for name in NAMES):
        raise SystemFailure(f"the saved kernel settings {path} lack {' or '.join(NAMES)}")
    return Previous({name: saved[name] for name in NAMES}, None, None, saved.get("saved_at"))


def _forget_previous(paths: Paths) -> None:
    for path in (paths.previous_handler, paths.state_dir / LEGACY_PREVIOUS):
        try:
            path.unlink(missing_ok=True)
        except OSError as e:
            raise SystemFailure(f"cannot remove {path}: {e.strerror}") from None


def _found(host: Host) -> Previous:
    return Previous(live(host), _read_bytes(host.csplice_settings),
                    _read_bytes(sysctl.sysctl_d_file(host.sysctl_d)), time.time(),
                    host.csplice_settings.parent.is_dir())


# --- the writes, every one under the lock -----------------------------------------------------------------

def _write_sysctl(host: Host, name: str, value: str) -> None:
    if "\n" in value:
        raise ValueError(f"{name}: a sysctl value is one line")
    path = sysctl.path_of(name, host.sysctl_root)
    data = (value + "\n").encode()
    try:
        # No O_CREAT: a setting the kernel does not have is an error, not a new file.
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
        try:
            if os.write(fd, data) != len(data):
                raise OSError(errno.EIO, "short write")
        finally:
            os.close(fd)
    except OSError as e:
        raise SystemFailure(f"cannot set {name} to {value!r} ({path}): {e.strerror}") from None
    # Some handlers' writes are cut short or refused silently by older kernels: read back to be sure.
    if (now := sysctl.read(name, host.sysctl_root)) != value:
        raise SystemFailure(f"{name} was set to {value!r} but the kernel reports {now!r}")


def _write_sysctls(host: Host, values: dict[str, str]) -> None:
    # core_pattern last: by the time the kernel runs csplice, its settings and the pipe limit are in place. (A
    # release writes the pattern first, itself: once it is not ours, no new crash reaches csplice.)
    for name in sorted(values, key=lambda n: n == CORE_PATTERN):
        _write_sysctl(host, name, values[name])


def _put_file(path: Path, data: bytes | None, mode: int = 0o644) -> None:
    """path replaced by data atomically, or removed when data is None."""
    try:
        if data is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            write_atomic(path, data, mode)
    except OSError as e:
        raise SystemFailure(f"cannot {'remove' if data is None else 'write'} {path}: {e.strerror}") from None


def render_sysctl_d(values: dict[str, str]) -> bytes:
    body = "# Written by `corehandler install`; removed by `corehandler uninstall`.\n"
    return (body + "".join(f"{name} = {value}\n" for name, value in values.items())).encode()


class Claim:
    """The handler, being claimed by paths' installation, inside the lock (claim())."""

    def __init__(self, host: Host, paths: Paths, found: Previous, already_ours: bool, retaken: bool = False):
        self.host, self.paths, self.found, self.already_ours = host, paths, found, already_ours
        # Taken back from a package that took it (displaced): what this installation saved at its first claim
        # stays what uninstall restores; the csplice.conf found now is this installation's own.
        self.saves_previous = not already_ours and not (retaken and read_previous(paths) is not None)
        if self.saves_previous:
            _put_file(paths.previous_handler, _render_previous(found), 0o600)
        self.me = this_installation(paths, create=True)

    @property
    def replaced(self) -> str | None:
        """The pattern this claim replaces; None when it was this installation's already."""
        return None if self.already_ours else self.found.sysctls[CORE_PATTERN]

    def write_settings(self, text: str) -> None:
        """csplice.conf (text renders this installation as its owner: csplice_contract.render_settings)."""
        if not is_me(settings_owner(text), self.paths):
            raise ValueError("csplice.conf must name the installation that claims the handler")
        _put_file(self.host.csplice_settings, text.encode())

    def point(self, values: dict[str, str], *, persist: bool | None) -> Path | None:
        """The kernel's settings live, core_pattern last; persist True also writes our sysctl.d file, False
        removes it (the package's own file in /usr/lib is the truth then), None leaves it alone (the agent's
        pod must not write the host's /etc). Half done is the worst state: a refusal puts back what was found."""
        target = sysctl.sysctl_d_file(self.host.sysctl_d)
        try:
            if persist is not None:
                _put_file(target, render_sysctl_d(values) if persist else None)
            _write_sysctls(self.host, values)
        except SystemFailure:
            if not self.already_ours:
                with contextlib.suppress(SystemFailure):
                    _restore(self.host, self.found, persistent=persist is not None)
                    _forget_previous(self.paths)
            raise
        return target if persist else None


def _describe(found: Owner) -> str:
    ident = f", installation {found.installation}" if found.installation else ""
    return f"the installation in {found.state_dir}{ident}"


class HandlerTaken(HandlerConflictError):
    """Another handler owns the host's crashes: `who` names it, the message says what to do."""

    def __init__(self, who: str, message: str):
        super().__init__(message)
        self.who = who


def check_claim(host: Host, paths: Paths, *, force: bool = False, socket_path: Path | None = None) -> bool:
    """Raises HandlerConflictError where claim() would refuse (without force: another handler in core_pattern,
    systemd-coredump, apport, ...; another live installation's csplice); True if this installation owns the
    handler already. Changes nothing: install asks before it makes its state dirs."""
    pattern = sysctl.read(CORE_PATTERN, host.sysctl_root)
    program = handler_program(pattern)
    current = owner(host, socket_path)
    mine = is_me(current, paths)
    if not force and program is not None and not is_corehandler(pattern, socket_path):
        raise HandlerTaken(f"another core handler ({program})", f"another core handler is installed ({program}): "
                           "`corehandler install --force` replaces it and uninstall puts it back")
    if not force and not mine and current is not None and is_live(current):
        who = f"{_describe(current)} ({program} in core_pattern)"
        raise HandlerTaken(who, f"{who} captures this host's crashes: uninstall it there, or take the handler "
                           "over with --force (its uninstall then leaves the host to you)")
    return mine


@contextlib.contextmanager
def claim(host: Host, paths: Paths, *, force: bool = False, socket_path: Path | None = None,
          what: str = "install"):
    """Yields a Claim inside the host lock, after check_claim(). What the host had is saved once in
    paths.previous_handler (not when this installation owns the handler already: a second install keeps the
    values from before the first). paths' state dir must exist: its installation id is made here."""
    with sysctl.held_lock(host.lock, what):
        mine = check_claim(host, paths, force=force, socket_path=socket_path)
        yield Claim(host, paths, _found(host), mine, retaken=not mine and displaced(host, paths, socket_path))


def refresh(host: Host, paths: Paths, text: str, *, socket_path: Path | None = None,
            wait: float = REFRESH_WAIT) -> bool:
    """csplice.conf replaced by text if this installation owns the handler (and the text differs); True if it
    does own it. Never waits longer than wait for the lock: raises sysctl.LockBusy naming the holder then."""
    if not owns(host, paths, socket_path):  # checked again under the lock; most daemons stop here
        return False
    with sysctl.held_lock(host.lock, "refresh", timeout=wait):
        if not owns(host, paths, socket_path):
            return False
        if _read_bytes(host.csplice_settings) != text.encode():
            _put_file(host.csplice_settings, text.encode())
        return True


def _restore_files(host: Host, previous: Previous, *, persistent: bool) -> None:
    _put_file(host.csplice_settings, previous.settings)
    if not previous.settings_dir:
        # Made for csplice.conf: gone with it, unless something else is in it now (or it is a mount point).
        with contextlib.suppress(OSError):
            host.csplice_settings.parent.rmdir()
    if persistent:
        _put_file(sysctl.sysctl_d_file(host.sysctl_d), previous.sysctl_d)


def _restore(host: Host, previous: Previous, *, persistent: bool) -> None:
    # The pattern first: once it is not ours, no new crash reaches csplice.
    _write_sysctl(host, CORE_PATTERN, previous.sysctls[CORE_PATTERN])
    _write_sysctl(host, CORE_PIPE_LIMIT, previous.sysctls[CORE_PIPE_LIMIT])
    _restore_files(host, previous, persistent=persistent)


def release(host: Host, paths: Paths, *, socket_path: Path | None = None, persistent: bool = True) -> dict:
    """What paths' claim found goes back exactly (the kernel's defaults if nothing was saved) if csplice.conf
    still names this installation: the sysctls if the live pattern is still corehandler's (another handler that
    took over since keeps them), csplice.conf, and our sysctl.d file unless persistent=False (the agent's).
    Another installation's handler is left alone. The saved values are spent either way."""
    with sysctl.held_lock(host.lock, "uninstall"):
        current = sysctl.read(CORE_PATTERN, host.sysctl_root)
        mine = is_me(settings_owner_of(host), paths)
        live_ours = mine and is_corehandler(current, socket_path)
        previous = read_previous(paths)
        # Nothing saved (the kernel's defaults) or saved by v0.3: no csplice.conf or sysctl.d file known from
        # before, so ours go.
        base = previous or Previous(dict(KERNEL_DEFAULTS), None, None)
        if live_ours:
            # The pattern first: once it is not ours, no new crash reaches csplice.
            _write_sysctl(host, CORE_PATTERN, base.sysctls[CORE_PATTERN])
            _write_sysctl(host, CORE_PIPE_LIMIT, base.sysctls[CORE_PIPE_LIMIT])
        if mine:
            _restore_files(host, base, persistent=persistent)
        _forget_previous(paths)
    restored = dict(base.sysctls) if live_ours else None
    return {"was_installed": live_ours, "restored": restored,
            "restored_from": None if restored is None else ("saved" if previous else "kernel defaults"),
            "left_alone": None if restored is not None else current,
            "sysctl_d_removed": bool(mine and persistent and base.sysctl_d is None)}


class Borrowed:
    """The handler lent for a while (borrow()): set what the borrower needs; all is put back on exit."""

    def __init__(self, host: Host, token: str):
        self.host, self.token = host, token

    def point(self, pattern: str, pipe_limit: int | str = 16) -> None:
        _write_sysctls(self.host, {CORE_PATTERN: pattern, CORE_PIPE_LIMIT: str(pipe_limit)})

    def write_settings(self, text: str) -> None:
        _put_file(self.host.csplice_settings, text.encode())


@contextlib.contextmanager
def borrow(host: Host = Host(), what: str = "borrowed"):
    """Holds the host lock and yields a Borrowed; on every exit, failure included, puts back core_pattern,
    core_pipe_limit, csplice.conf and our sysctl.d file as found, and fs.suid_dumpable, which a borrower's
    package install can change (systemd-coredump's postinst applies its 50-coredump.conf, which sets 2).
    Processes started meanwhile hold the lock too (sysctl.LOCK_TOKEN_ENV in os.environ): a test's
    `corehandler install` or daemon can write."""
    with sysctl.held_lock(host.lock, what) as token:
        found = _found(host)
        suid = sysctl.read_or_none(SUID_DUMPABLE, host.sysctl_root)
        before = os.environ.get(sysctl.LOCK_TOKEN_ENV)
        os.environ[sysctl.LOCK_TOKEN_ENV] = token
        try:
            yield Borrowed(host, token)
        finally:
            if before is None:
                os.environ.pop(sysctl.LOCK_TOKEN_ENV, None)
            else:
                os.environ[sysctl.LOCK_TOKEN_ENV] = before
            _restore(host, found, persistent=True)
            if suid is not None and sysctl.read_or_none(SUID_DUMPABLE, host.sysctl_root) != suid:
                _write_sysctl(host, SUID_DUMPABLE, suid)
