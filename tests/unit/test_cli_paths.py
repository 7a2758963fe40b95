"""The CLI's --state-dir: another state dir is another installation, whose supervisor is not the host's."""

from __future__ import annotations

import argparse
from pathlib import Path

from corehandler.cli.common import base_paths, global_options
from corehandler.paths import DEFAULT_STATE_DIR, Paths


def parse(*argv: str) -> Paths:
    parser = argparse.ArgumentParser()
    global_options(parser)
    return base_paths(parser.parse_args(list(argv)))


def test_another_state_dir_has_its_own_run_and_log_dirs(tmp_path):
    paths = parse("--state-dir", str(tmp_path / "state"))
    assert (paths.run_dir, paths.log_dir) == (tmp_path / "state" / "run", tmp_path / "state" / "log")
    assert paths.run_dir != Paths().run_dir


def test_the_default_state_dir_keeps_the_hosts_run_dir():
    assert parse("--state-dir", str(DEFAULT_STATE_DIR)).run_dir == Paths().run_dir == Path("/run/corehandler")
    assert parse().log_dir == Paths().log_dir
