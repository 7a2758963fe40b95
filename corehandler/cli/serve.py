"""serve: the daemon, in the foreground (systemd's Type=notify service runs this: observe/sdnotify.py)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable

from corehandler.cli.common import load
from corehandler.config import write_csplice_settings
from corehandler.csplice_contract import csplice_version
from corehandler.daemon import Daemon, Settings, settings_from_config
from corehandler.errors import CorehandlerError
from corehandler.fleet.upload import Uploader
from corehandler.host import overview, writerates
from corehandler.observe.journal import JournalObserver
from corehandler.observe.metrics import MetricsObserver
from corehandler.observe.sdnotify import SystemdNotifier
from corehandler.paths import csplice_path
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


def observers_for(config, paths, store_limit) -> tuple[list, list[str]]:
    """The journald and Prometheus observers the config asks for, and the problems met setting them up that
    must not stop ingest (a metrics port taken). store_limit() is the current max_use in bytes."""
    observers, problems = [], []
    if config.journal.enabled:
        observers.append(JournalObserver())
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
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if args.debug else logging.INFO,
                        format="%(levelname)s: %(message)s")


def serve(args: argparse.Namespace, config, paths, adjust: Callable = lambda config: config) -> int:
    """The daemon on config and paths until it is asked to stop; adjust(config) is applied to every config read
    again on reload too (the node agent's, host/agent.py)."""

    # Always there, even with uploads off: it owns the queue (off, it empties it) and a reload may turn it on.
    # Its own thread (started by on_start, once the daemon holds the state dir) and index connection: ingest
    # never waits on the network.
    uploader = Uploader(config.upload, paths.state_dir)

    # csplice.conf follows the config (reload) and the spool's measured write rates (writerates, measured in a
    # thread of its own): both render the one current config, one at a time.
    current, rendering = [config, paths], threading.Lock()

    def write_settings() -> None:
        with rendering:
            write_csplice_settings(*current)

    def reload() -> Settings:
        new, new_paths = load(args)
        new = adjust(new)
        settings = settings_from_config(new, new_paths, sweep_interval=args.sweep_interval)
        uploader.reconfigure(new.upload)
        current[:] = [new, new_paths]
        write_settings()
        return settings

    write_settings()
    writerates.refresh_in_background(paths, write_settings)
    daemon = Daemon(settings_from_config(config, paths, sweep_interval=args.sweep_interval), (), reload,
                    handle_signals=True)
    observers, problems = observers_for(config, paths, lambda: daemon.settings.policy.max_use)
    daemon.observers.append(SystemdNotifier())  # READY once run() holds the state dir; the watchdog after
    daemon.observers.extend(observers)
    daemon.observers.append(uploader)
    for problem in problems:
        daemon.report_error("config", problem)
    return daemon.run()
