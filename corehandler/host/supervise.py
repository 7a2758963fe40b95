"""`corehandler serve` without systemd: a small supervisor process that keeps the daemon running.

Where systemd is PID 1, corehandler.service does this job. Containers and hosts with another init get this
instead, and it behaves like the unit: the daemon runs in the foreground under a supervisor that restarts it
when it fails (backoff from 1 s doubling to 60 s, reset once it has stayed up a minute; a clean exit is not
restarted, like Restart=on-failure, nor one of NO_RESTART, like RestartPreventExitStatus=), forwards SIGHUP
(reload) and SIGTERM (stop, SIGKILL after a timeout).

The supervisor is a fresh interpreter started by a double fork and setsid, so it shares nothing with the
installer that started it (no terminal, no inherited descriptors, no threads) and is re-parented to init.
It holds an exclusive flock on its pid file for its whole life: "is it running" is a lock test, never a guess
from a pid that may have been reused. Its own lines and the daemon's stdout/stderr go to one log file.

The same supervisor runs the coredump socket's listener (`csplice --listen`) in socket mode, as a second
service with its own pid and log files (LISTENER). While it is down the kernel drops dumps silently, so it
restarts fast (0.1 s doubling to 5 s). It never changes core_pattern: falling back to pipe mode is the
installer's decision (`install --mode auto`), made once, not a flip behind the admin's back on every failure.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from corehandler.errors import EXIT_CONFLICT, EXIT_INDEX_NEWER, CorehandlerError
from corehandler.paths import DEFAULT_STATE_DIR, Paths

PID_FILE = "corehandler.pid"  # the supervisor's pid; flocked while it lives
SERVE_PID_FILE = "serve.pid"  # the pid of the daemon it is running now
LOG_FILE = "corehandler.log"

# What a restart cannot fix: the index a newer corehandler wrote (a downgrade). The unit's
# RestartPreventExitStatus= lists the same.
NO_RESTART = (EXIT_INDEX_NEWER,)

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0


@dataclass(frozen=True)
class Service:
    """What one supervisor runs: its files in run_dir and log_dir, and how fast it restarts a failed child."""

    name: str
    pid_file: str
    child_pid_file: str
    log_file: str
    backoff_first: float
    backoff_max: float


DAEMON = Service("corehandler", PID_FILE, SERVE_PID_FILE, LOG_FILE, BACKOFF_FIRST, BACKOFF_MAX)
LISTENER = Service("capture", "capture.pid", "capture-listener.pid", "capture.log", 0.1, 5.0)
SERVICES = {service.name: service for service in (DAEMON, LISTENER)}
STABLE_AFTER = 60.0  # a daemon that stayed up this long starts the backoff afresh
KILL_AFTER = 10.0  # the daemon's grace time between SIGTERM and SIGKILL (systemd's TimeoutStopSec is 90)
POLL = 0.2


class SuperviseError(CorehandlerError):
    """The supervised daemon could not be started or stopped; the message says why."""


@dataclass(frozen=True)
class Status:
    running: bool
    pid: int | None  # the supervisor
    daemon_pid: int | None  # `corehandler serve`, while it is up
    pid_file: str
    log_file: str
    restarts: int = 0  # of a failed child, since this supervisor started
    last_restart: float | None = None  # epoch seconds
    last_restart_why: str | None = None  # "was killed by SIGKILL", "exited with status 73"

    def as_dict(self) -> dict:
        return asdict(self)


def _restarts_file(paths_or_run_dir, service: Service) -> Path:
    run_dir = getattr(paths_or_run_dir, "run_dir", paths_or_run_dir)
    return Path(run_dir) / f"{service.name}.restarts"


def _read_restarts(path: Path) -> dict:
    """The supervisor's restart note: {"restarts", "last_restart", "last_restart_why"}; {} without one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: data.get(k) for k in ("restarts", "last_restart", "last_restart_why") if data.get(k) is not None}


def systemd_is_pid1(run_root: Path = Path("/run")) -> bool:
    """True when systemd is the init system, by the test sd_booted(3) and deb-systemd-invoke use.

    systemd creates /run/systemd/system at boot; the systemd package being installed (as on this machine's
    containers) does not, so this tells "systemd manages services here" rather than "systemd is installed".
    """
    return (run_root / "systemd" / "system").is_dir()


def serve_command(config_dir: Path | None = None, state_dir: Path | None = None) -> list[str]:
    """The daemon's command line, run with the interpreter that runs us (the package's private one)."""
    command = [sys.executable, "-m", "corehandler"]
    if config_dir is not None:
        command += ["--config-dir", str(config_dir)]
    if state_dir is not None:
        command += ["--state-dir", str(state_dir)]
    return command + ["serve"]


def _pid_file(paths: Paths, service: Service = DAEMON) -> Path:
    return paths.run_dir / service.pid_file


def _log_file(paths: Paths, service: Service = DAEMON) -> Path:
    return paths.log_dir / service.log_file


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def _lock_held(pid_file: Path) -> bool:
    """True while a supervisor holds the pid file's lock, which it does from start until it exits."""
    try:
        fd = os.open(pid_file, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as err:
        raise SuperviseError(f"cannot read the supervisor's pid file {pid_file}: {err.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def status(paths: Paths, service: Service = DAEMON) -> Status:
    pid_file = _pid_file(paths, service)
    running = _lock_held(pid_file)
    pid = daemon_pid = None
    if running:
        # The supervisor writes its pid right after taking the lock; a reader can come in between.
        deadline = time.monotonic() + 2.0
        while (pid := _read_pid(pid_file)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        daemon_pid = _read_pid(paths.run_dir / service.child_pid_file)
    return Status(running, pid, daemon_pid, str(pid_file), str(_log_file(paths, service)),
                  **(_read_restarts(_restarts_file(paths, service)) if running else {}))


def start(paths: Paths, config_dir: Path | None = None, *, command: list[str] | None = None,
          timeout: float = 10.0, kill_after: float = KILL_AFTER, service: Service = DAEMON) -> Status:
    """Starts the supervised daemon unless it is already running; returns its status either way.

    `command` replaces `corehandler serve` (tests run a harmless program); `kill_after` is the daemon's
    grace time between SIGTERM and SIGKILL when stopped. Raises SuperviseError, with the
    end of the log file, if the supervisor does not report that it started the daemon within `timeout`.
    """
    current = status(paths, service)
    if current.running:
        return current
    if command is None:
        # A state directory given to `install` on the command line must be the one the daemon watches.
        state_dir = None if paths.state_dir == DEFAULT_STATE_DIR else paths.state_dir
        command = serve_command(config_dir, state_dir)
    try:
        paths.run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        paths.log_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        os.chmod(paths.log_dir, 0o750)
    except OSError as err:
        raise SuperviseError(f"cannot prepare {err.filename} for the supervised daemon: {err.strerror}") from None
    log_file = _log_file(paths, service)
    argv = [sys.executable, "-m", "corehandler.host.supervise", "run", "--run-dir", str(paths.run_dir),
            "--log-file", str(log_file), "--kill-after", str(kill_after), "--service", service.name]
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked children, which end in exec or _exit
        try:
            os.close(ready_r)
            os.setsid()
            if os.fork():
                os._exit(0)
            _detach_and_exec(argv + ["--ready-fd", str(ready_w), "--", *command], log_file, ready_w)
        finally:
            os._exit(127)
    os.close(ready_w)
    os.waitpid(child, 0)
    try:
        message = _read_ready(ready_r, timeout)
    finally:
        os.close(ready_r)
    if message.startswith("already running"):  # another start() won the race: that one is ours too
        return status(paths, service)
    if not message.startswith("ready "):
        # It said why and is on its way out (or said nothing in time): let it finish so that no half-started
        # supervisor is seen by the next status().
        _wait_unlocked(paths, timeout, service)
        reason = message.strip() or f"it reported nothing within {timeout:g} s"
        raise SuperviseError(f"could not start the supervised {service.name}: {reason} (log: {log_file})"
                             f"{_tail(log_file)}")
    return status(paths, service)


def _detach_and_exec(argv: list[str], log_file: Path, keep_fd: int) -> None:  # pragma: no cover - child
    """The grandchild: stdio on /dev/null and the log, no inherited descriptors, then the supervisor."""
    # Not a session leader (so it can never get a controlling terminal back), but a process group of its own,
    # which the daemon joins: stop()'s last resort kills the group.
    os.setpgid(0, 0)
    os.chdir("/")
    os.umask(0o022)  # its pid files are for anyone's `status`; the daemon gets the unit's 0077 (see _loop)
    null = os.open("/dev/null", os.O_RDWR)
    log = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    os.fchmod(log, 0o640)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    # Whatever the caller had open (dpkg's status pipe, a test runner's capture) must not stay open for
    # the daemon's lifetime: a reader waiting for EOF on it would hang.
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, os.sysconf("SC_OPEN_MAX"))
    os.set_inheritable(keep_fd, True)
    os.execv(argv[0], argv)


def _read_ready(fd: int, timeout: float) -> str:
    data = b""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def _tail(log_file: Path, lines: int = 5) -> str:
    try:
        text = log_file.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "".join("\n  " + line for line in text)


def stop(paths: Paths, timeout: float = KILL_AFTER + 5.0, service: Service = DAEMON) -> bool:
    """Stops the supervisor and its daemon; True if they were running.

    SIGTERM to the supervisor, which passes it on and gives the daemon KILL_AFTER seconds; a supervisor
    still alive after `timeout` is killed with its whole process group (the daemon is in it).
    """
    current = status(paths, service)
    if not current.running or current.pid is None:
        _remove_pid_files(paths, service)
        return False
    _signal(current.pid, signal.SIGTERM)
    if not _wait_unlocked(paths, timeout, service):
        try:
            os.killpg(current.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not _wait_unlocked(paths, 5.0, service):
            raise SuperviseError(f"the supervisor (pid {current.pid}) survived SIGKILL")
    # It releases the lock as its last act; wait for the exit itself, so that "stopped" means gone.
    _wait_exited(current.pid, 5.0)
    _remove_pid_files(paths, service)
    return True


def reload(paths: Paths) -> bool:
    """Asks the daemon to reload its configuration (SIGHUP through the supervisor); True if it runs."""
    current = status(paths)
    if not current.running or current.pid is None:
        return False
    _signal(current.pid, signal.SIGHUP)
    return True


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _wait_unlocked(paths: Paths, timeout: float, service: Service = DAEMON) -> bool:
    deadline = time.monotonic() + timeout
    while _lock_held(_pid_file(paths, service)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _wait_exited(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state == "Z":  # exited; reaping is init's business
            return
        time.sleep(0.02)


def _remove_pid_files(paths: Paths, service: Service = DAEMON) -> None:
    for name in (service.pid_file, service.child_pid_file):
        (paths.run_dir / name).unlink(missing_ok=True)


# --- the supervisor process itself ------------------------------------------------------------------------


class _Supervisor:
    def __init__(self, run_dir: Path, command: list[str], ready_fd: int | None, kill_after: float,
                 service: Service = DAEMON):
        self.run_dir = run_dir
        self.service = service
        self.kill_after = kill_after
        self.command = command
        self.ready_fd = ready_fd
        self.child: subprocess.Popen | None = None
        self.stop_requested_at: float | None = None
        self.restarts = 0

    def log(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        sys.stderr.write(f"{stamp} corehandler-supervise[{os.getpid()}]: {message}\n")
        sys.stderr.flush()

    def _ready(self, message: str) -> None:
        if self.ready_fd is not None:
            os.write(self.ready_fd, message.encode())
            os.close(self.ready_fd)
            self.ready_fd = None

    def _on_signal(self, signum, frame) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT) and self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
            signum = signal.SIGTERM
        if self.child is not None and self.child.returncode is None:
            _signal(self.child.pid, signum)

    def run(self) -> int:
        self.run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        lock = os.open(self.run_dir / self.service.pid_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._ready(f"already running (pid {_read_pid(self.run_dir / self.service.pid_file)})")
            return 1
        os.ftruncate(lock, 0)
        os.write(lock, f"{os.getpid()}\n".encode())
        _restarts_file(self.run_dir, self.service).unlink(missing_ok=True)  # counted per supervisor
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        try:
            return self._loop()
        finally:
            (self.run_dir / self.service.child_pid_file).unlink(missing_ok=True)
            (self.run_dir / self.service.pid_file).unlink(missing_ok=True)
            _restarts_file(self.run_dir, self.service).unlink(missing_ok=True)
            os.close(lock)

    def _loop(self) -> int:
        backoff = self.service.backoff_first
        while self.stop_requested_at is None:
            started = time.monotonic()
            self.log("starting: " + " ".join(self.command))
            try:
                # UMask=0077 as in corehandler.service: dumps hold secrets.
                self.child = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, umask=0o077)
            except OSError as err:
                self.log(f"cannot run {self.command[0]}: {err.strerror}")
                self._ready(f"cannot run {self.command[0]}: {err.strerror}")
                return 1
            (self.run_dir / self.service.child_pid_file).write_text(f"{self.child.pid}\n")
            self._ready(f"ready {os.getpid()} {self.child.pid}\n")
            returncode = self._wait_child()
            (self.run_dir / self.service.child_pid_file).unlink(missing_ok=True)
            if self.stop_requested_at is not None:
                self.log(f"stopped; the daemon {_describe(returncode)}")
                return 0
            if returncode == 0:
                self.log("the daemon exited cleanly without being asked to; not restarting it")
                return 0
            if returncode in NO_RESTART:
                # As RestartPreventExitStatus= in corehandler.service: another try would fail the same way.
                self.log(f"the daemon {_describe(returncode)} (the index is a newer version's: its log says the "
                         "way back); not restarting it")
                return returncode
            if time.monotonic() - started >= STABLE_AFTER:
                backoff = self.service.backoff_first
            self.log(f"the daemon {_describe(returncode)}; restarting it in {backoff:g} s")
            self._note_restart(_describe(returncode))
            self._sleep(backoff)
            backoff = min(backoff * 2, self.service.backoff_max)
        self.log("stopped")
        return 0

    def _note_restart(self, why: str) -> None:
        """What `status` says of a gap: how often the child was restarted, when last, and why (a listener's
        restart is a window in which the kernel dropped dumps)."""
        self.restarts += 1
        path = _restarts_file(self.run_dir, self.service)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text(json.dumps({"restarts": self.restarts, "last_restart": time.time(),
                                       "last_restart_why": why}))
            os.replace(tmp, path)
        except OSError as err:
            self.log(f"cannot note the restart in {path}: {err.strerror}")

    def _wait_child(self) -> int:
        assert self.child is not None
        killed = False
        while True:
            try:
                return self.child.wait(timeout=POLL)
            except subprocess.TimeoutExpired:
                asked = self.stop_requested_at
                if not killed and asked is not None and time.monotonic() - asked > self.kill_after:
                    self.log(f"the daemon ignored SIGTERM for {self.kill_after:g} s; killing it")
                    self.child.kill()
                    killed = True

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.stop_requested_at is None and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(POLL, left))


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def main(argv: list[str] | None = None) -> int:
    """`python -m corehandler.host.supervise start|stop|status|reload`: what the package's maintainer scripts run
    where systemd is not PID 1 (they must not depend on the CLI's verbs); `run` is the supervisor itself.
    Exit codes are the CLI's (errors.py): `status` and `reload` exit 5 (EXIT_CONFLICT) when it is not running."""
    parser = argparse.ArgumentParser(prog="python -m corehandler.host.supervise")
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb in ("start", "stop", "status", "reload"):
        sub = verbs.add_parser(verb)
        sub.add_argument("--config-dir", type=Path, default=None)
    run = verbs.add_parser("run")
    run.add_argument("--run-dir", type=Path, required=True)
    run.add_argument("--log-file", type=Path, required=True)
    run.add_argument("--ready-fd", type=int, default=None)
    run.add_argument("--kill-after", type=float, default=KILL_AFTER)
    run.add_argument("--service", choices=sorted(SERVICES), default=DAEMON.name)
    run.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.verb == "run":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return _Supervisor(args.run_dir, command, args.ready_fd, args.kill_after, SERVICES[args.service]).run()
    paths = Paths()
    try:
        if args.verb == "start":
            current = start(paths, args.config_dir)
            print(f"corehandler: running, supervisor pid {current.pid}, daemon pid {current.daemon_pid}, "
                  f"log {current.log_file}")
        elif args.verb == "stop":
            print("corehandler: stopped" if stop(paths) else "corehandler: was not running")
        elif args.verb == "reload":
            if not reload(paths):
                print("corehandler: not running", file=sys.stderr)
                return EXIT_CONFLICT
        else:
            current = status(paths)
            print(f"corehandler: running, supervisor pid {current.pid}, daemon pid {current.daemon_pid}"
                  if current.running else "corehandler: not running")
            # The CLI's codes (errors.py): 3 is a configuration error there, so "not running" is 5, the
            # system not in the state the verb expects, as `corehandler` itself says it.
            return 0 if current.running else EXIT_CONFLICT
    except CorehandlerError as err:
        print(f"corehandler: {err.message}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
