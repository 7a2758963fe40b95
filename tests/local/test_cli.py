"""The command line: exit codes, one-line errors, --json, global options before or after the verb."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from corehandler.cli import main
from corehandler.errors import EXIT_CONFIG, EXIT_NOMATCH, EXIT_PERMISSION, EXIT_USAGE
from corehandler.host import install


@pytest.fixture
def etc(tmp_path):
    d = tmp_path / "etc"
    d.mkdir()
    return d


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_no_verb_lists_dumps_like_coredumpctl(capsys, etc, tmp_path):
    code, out, err = run(capsys, "--config-dir", str(etc), "--state-dir", str(tmp_path / "state"))
    assert code == EXIT_NOMATCH
    assert err.splitlines()[-1] == f"corehandler: no dumps: there is no index in {tmp_path / 'state'}"


@pytest.mark.parametrize("argv", [["frobnicate"], ["config"], ["config", "bogus"], ["install", "--bogus"],
                                  ["--json", "status", "extra"]])
def test_argparse_usage_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == EXIT_USAGE
    assert "usage:" in capsys.readouterr().err


def test_config_check_ok(capsys, etc):
    code, out, err = run(capsys, "--config-dir", str(etc), "config", "check")
    assert (code, out, err) == (0, "config OK: no files, the defaults\n", "")
    (etc / "corehandler.toml").write_text("[capture]\nmax_pending = 3\n")
    code, out, _ = run(capsys, "config", "check", "--config-dir", str(etc), "--json")
    assert code == 0 and json.loads(out) == {"ok": True, "files": [str(etc / "corehandler.toml")]}


def test_config_error_is_one_line_with_exit_3(capsys, etc):
    (etc / "corehandler.toml").write_text('[capture]\nmax_dump_size = "lots"\n')
    for argv in (["config", "check"], ["config", "show"], ["status"], ["install"]):
        code, out, err = run(capsys, "--config-dir", str(etc), *argv)
        assert code == EXIT_CONFIG, argv
        assert out == ""
        assert err == f'corehandler: {etc}/corehandler.toml: capture.max_dump_size = "lots": \'lots\' is not a ' \
                      'size: expected a number of bytes or a number with K, M, G, T, P or E (binary: 1K = 1024), ' \
                      'e.g. "4G"\n'


def test_config_show_human_and_json(capsys, etc, tmp_path):
    (etc / "corehandler.toml").write_text('[capture]\nmax_dump_size = "2G"\n')
    code, out, _ = run(capsys, "--config-dir", str(etc), "config", "show")
    assert code == 0 and tomllib.loads(out)["capture"]["max_dump_size"] == "2G"
    code, out, _ = run(capsys, "--config-dir", str(etc), "--json", "config", "show")
    assert json.loads(out)["capture"]["max_dump_size"] == 2 << 30
    code, out, _ = run(capsys, "--config-dir", str(etc), "--state-dir", str(tmp_path / "s"), "config", "show",
                       "--csplice")
    assert f"spool_dir={tmp_path}/s/spool\n" in out and "max_dump_size=2147483648\n" in out


def test_state_dir_option_overrides_the_config(capsys, etc, tmp_path):
    (etc / "corehandler.toml").write_text('state_dir = "/srv/cores"\n')
    code, out, _ = run(capsys, "--config-dir", str(etc), "config", "show", "--csplice")
    assert "spool_dir=/srv/cores/spool\n" in out
    code, out, _ = run(capsys, "config", "show", "--csplice", "--config-dir", str(etc), "--state-dir",
                       str(tmp_path / "x"))
    assert f"spool_dir={tmp_path}/x/spool\n" in out


def test_not_root_exit_4(capsys, etc, monkeypatch):
    monkeypatch.setattr(install.os, "geteuid", lambda: 1000)
    for verb in ("install", "uninstall"):
        code, out, err = run(capsys, "--config-dir", str(etc), verb)
        assert code == EXIT_PERMISSION
        assert err == f"corehandler: {verb} changes kernel settings and needs root (run it with sudo)\n"


def test_status_reads_the_host_without_changing_it(capsys, etc, tmp_path):
    before = {n: open(f"/proc/sys/kernel/{n}").read() for n in ("core_pattern", "core_pipe_limit")}
    code, out, err = run(capsys, "--config-dir", str(etc), "--state-dir", str(tmp_path / "state"), "status",
                         "--json")
    assert code == 0, err
    st = json.loads(out)
    assert st["core_pattern"] == before["core_pattern"].removesuffix("\n")
    assert st["core_pipe_limit"] == int(before["core_pipe_limit"])
    assert st["spool"]["path"] == str(tmp_path / "state/spool")
    assert not (tmp_path / "state").exists()
    code, out, _ = run(capsys, "--config-dir", str(etc), "--state-dir", str(tmp_path / "state"), "status")
    assert code == 0 and out.startswith("installed:")
    assert f"core_pattern:     {st['core_pattern']}\n" in out


def test_python_dash_m(etc):
    result = subprocess.run([sys.executable, "-m", "corehandler", "--config-dir", str(etc), "config", "check"],
                            capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (0, "config OK: no files, the defaults\n")
    result = subprocess.run([sys.executable, "-m", "corehandler", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("corehandler ")
