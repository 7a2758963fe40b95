"""serve: the daemon, in the foreground (systemd's Type=notify service runs this: observe/sdnotify.py)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable

from corehandler.cli.common import load
from corehandler.csplice_contract import csplice_version
from corehandler.daemon import Daemon, Settings, settings_from_config
from corehandler.errors import CorehandlerError
from corehandler.fleet.upload import Uploader
from corehandler.host import handler, overview, writerates
from corehandler.observe import logformat
from corehandler.observe.crashlog import CrashLog
from corehandler.observe.journal import JournalObserver
from corehandler.observe.metrics import MetricsObserver
from corehandler.observe.sdnotify import SystemdNotifier
from corehandler.observer import Quiet
from corehandler.paths import Host, csplice_path
from corehandler.store import scrub

log = logging.getLogger("corehandler.serve")


def register(commands) -> None:
    daemon_options(commands.add("serve", run_serve,
                                help="run the daemon in the foreground: ingest, compress, index, retain"))


def daemon_options(p: argparse.ArgumentParser) -> None:
    """The options of a verb that runs the daemon (serve, agent run)."""
    p.add_argument("--sweep-interval", type=float, default=30.0, metavar="SEC",
                   help="how often the spool is swept besides inotify (default 30)")
    p.add_argument("--debug", action="store_true", help="log debug messages too")
    p.add_argument("--log-format", choices=logformat.FORMATS, default="auto",
                   help="text (LEVEL: message), json (a JSON object per line, with a crash's pod, namespace, exe, "
                        "signal and signature as fields), or auto: json in a Kubernetes pod, text elsewhere")


def observers_for(config, paths, store_limit) -> tuple[list, list[str]]:
    """The journald and Prometheus observers the config asks for, and the problems met setting them up that
    must not stop ingest (a metrics port taken). store_limit() is the current max_use in bytes."""
    observers, problems = [], []
    # Each dump is told once where an admin reads about it: its journal entry, else a line in this log.
    observers.append(JournalObserver() if config.journal.enabled else CrashLog())
    if config.metrics.enabled or config.metrics.textfile:
        metrics = MetricsObserver.from_config(config.metrics, state_dir=paths.state_dir,
                                              store_limit_bytes=store_limit, csplice_version=_csplice_version(),
                                              capture_probe=lambda: overview.capture_state(config, paths))
        if config.metrics.enabled:
            try:
                metrics.serve(config.metrics.listen, config.metrics.port)
            except OSError as e:
                problems.append(f"cannot serve metrics on {config.metrics.listen}:{config.metrics.port}: "
                                f"{e.strerror}; dumps are still ingested")
        observers.append(metrics)
    if config.scrub.enabled:
        observers.append(scrub.Scrubber(paths.state_dir, scrub.Policy(config.scrub.rate, config.scrub.interval)))
    return observers, problems


def _csplice_version() -> str | None:
    """`csplice --version`, for build_info; None (an empty label) when it cannot be run."""
    try:
        return csplice_version(csplice_path())
    except CorehandlerError as e:
        log.warning("%s; build_info has no csplice_version", e.message)
        return None


def run_serve(args: argparse.Namespace) -> int:
    # Until the daemon has its handler, a reload request (SIGHUP) must not kill us; the config is read below.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    log_to_stderr(args)
    return serve(args, *load(args))  # an invalid config stops us here, with the message naming file and key


def log_to_stderr(args: argparse.Namespace) -> None:
    logformat.setup(args.log_format, args.debug, sys.stderr)


class Refresher(Quiet):
    """csplice.conf follows this installation's config (reload) and the spool's measured write rates (measured
    in a thread of its own), if this installation owns the host's handler (host/handler.py refresh()); both
    render the one current config, one at a time. The first refresh comes once the daemon holds its state
    dir (on_start): a second daemon about to be refused changes nothing."""

    def __init__(self, host: Host, config, paths):
        self.host, self.config, self.paths = host, config, paths
        self._lock = threading.Lock()

    def refresh(self, config=None, paths=None) -> bool:
        """Renders csplice.conf from config and paths (the last ones given when None); True if this
        installation owns the handler."""
        with self._lock:
            if config is not None:
                self.config, self.paths = config, paths
            text = handler.settings_for(self.config.capture, self.paths, self.host)
            try:
                return handler.refresh(self.host, self.paths, text, socket_path=self.config.kernel.socket_path)
            except CorehandlerError as e:
                log.warning("%s; csplice.conf left as it is", e.message)
                return False

    def on_start(self) -> None:
        if not self.refresh():
            found = handler.owner(self.host, self.config.kernel.socket_path)
            who = f"{found.state_dir} captures" if found else "no corehandler installation captures"
            log.info("Not the host's handler (%s): ingesting %s only; `corehandler install` claims it",
                     who, self.paths.spool_dir)
        writerates.refresh_in_background(self.paths, self.refresh)


def serve(args: argparse.Namespace, config, paths, adjust: Callable = lambda config: config,
          host: Host = Host()) -> int:
    """The daemon on config and paths until it is asked to stop; adjust(config) is applied to every config read
    again on reload too (the node agent's, host/agent.py)."""

    # Always there, even with uploads off: it owns the queue (off, it empties it; off for want of the fleet's
    # libraries, it keeps it) and a reload may turn it on.
    # Its own thread (started by on_start, once the daemon holds the state dir) and index connection: ingest
    # never waits on the network.
    uploader = Uploader(config.upload, paths.state_dir)
    settings = Refresher(host, config, paths)

    def reload() -> Settings:
        new, new_paths = load(args)
        new = adjust(new)
        daemon_settings = settings_from_config(new, new_paths, sweep_interval=args.sweep_interval)
        uploader.reconfigure(new.upload)
        settings.refresh(new, new_paths)
        return daemon_settings

    daemon = Daemon(settings_from_config(config, paths, sweep_interval=args.sweep_interval), (), reload,
                    handle_signals=True)
    observers, problems = observers_for(config, paths, lambda: daemon.settings.policy.max_use)
    daemon.observers.append(settings)  # first: csplice.conf current before READY
    daemon.observers.append(SystemdNotifier())  # READY once run() holds the state dir; the watchdog after
    daemon.observers.extend(observers)
    daemon.observers.append(uploader)
    for problem in problems:
        daemon.report_error("config", problem)
    return daemon.run()
