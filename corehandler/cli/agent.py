"""agent install-csplice, agent run, agent uninstall: corehandler as a Kubernetes node agent (host/agent.py,
docs/kubernetes.md)."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from corehandler.cli import install, serve
from corehandler.cli.common import emit, load
from corehandler.host import agent


def register(commands) -> None:
    parser = commands.add("agent", None, help="run as a Kubernetes node agent in a privileged pod (needs root)")
    verbs = parser.add_subparsers(dest="agent_command", metavar="install-csplice|run|uninstall", required=True)
    common = [commands.common()]
    dir_help = f"the host directory the kernel runs csplice from (default {agent.LIBEXEC_DIR})"
    p = verbs.add_parser("install-csplice", parents=common, help="copy the image's static csplice into the host "
                         "directory the kernel runs it from (the init container)")
    p.add_argument("--dir", type=Path, default=agent.LIBEXEC_DIR, help=dir_help)
    p.add_argument("--csplice", type=Path, metavar="PATH",
                   help=f"the csplice to copy (default: {agent.STATIC_CSPLICE} beside this package's csplice)")
    p.set_defaults(handler=run_install_csplice)
    p = verbs.add_parser("run", parents=common, help="make that csplice the host's core handler and run the "
                         "daemon in the foreground; a stop puts the previous handler back")
    p.add_argument("--dir", type=Path, default=agent.LIBEXEC_DIR, help=dir_help)
    p.add_argument("--force", action="store_true",
                   help=f"replace another core handler (also {agent.ENV_FORCE}=1)")
    p.add_argument("--keep-on-stop", action="store_true", help="leave csplice in core_pattern when stopped, so "
                   f"capture goes on across a rolling update (also {agent.ENV_KEEP_ON_STOP}=1)")
    serve.daemon_options(p)
    p.set_defaults(handler=run_agent)
    p = verbs.add_parser("uninstall", parents=common, help="put the host's previous core handler back and remove "
                         "the host's csplice copy")
    p.add_argument("--dir", type=Path, default=agent.LIBEXEC_DIR, help=dir_help)
    p.set_defaults(handler=run_uninstall)


def run_install_csplice(args: argparse.Namespace) -> int:
    done = agent.install_csplice(args.dir.absolute(), args.csplice)
    how = "already in place" if done["unchanged"] else f"copied from {done['source']}"
    emit(args, done, f"csplice {done['version']} at {done['csplice']} ({how})")
    return 0


def _agent_load(args: argparse.Namespace):
    """The config and the agent's own installation: --state-dir, else agent.STATE_DIR."""
    if args.state_dir is None:
        args.state_dir = agent.STATE_DIR
    return load(args)


def run_agent(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the daemon's reload, once it has its handler
    serve.log_to_stderr(args)
    config, paths = _agent_load(args)
    config = agent.node_config(config)
    options = agent.Options(csplice=args.dir.absolute() / "csplice",
                            force=args.force or agent.env_flag(agent.ENV_FORCE),
                            keep_on_stop=args.keep_on_stop or agent.env_flag(agent.ENV_KEEP_ON_STOP))
    return agent.run(config, paths, options, lambda: serve.serve(args, config, paths, adjust=agent.node_config))


def run_uninstall(args: argparse.Namespace) -> int:
    _, paths = _agent_load(args)
    directory = args.dir.absolute()
    done = agent.stop(paths)
    done["csplice_removed"] = agent.remove_csplice(directory)
    lines = [install.uninstalled_line(done, "the agent")]
    if done["csplice_removed"]:
        lines.append(f"  removed {directory / 'csplice'}")
    emit(args, done, "\n".join(lines))
    return 0
