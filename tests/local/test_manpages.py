"""The generated man pages and shell completion: every verb, option and setting documented from the same
source as the code (the argparse tree, the config models, csplice's own tables), rendered by the real man(1)
without warnings, installed where man finds them with the shell completion (which tests/local/test_completion.py
asks the real bash and zsh)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from corehandler import errors, paths
from corehandler.cli import argtree, build_parser, completion, manpage
from corehandler.csplice_contract import SPECIFIERS

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "config" / "corehandler.toml"


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return manpage.pages()


def rendered(path: Path) -> subprocess.CompletedProcess:
    # What lintian runs on every man page it checks (its "groff-message" tag is any stderr here).
    return subprocess.run(["man", "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", str(path)],
                          capture_output=True, text=True, env={"MANWIDTH": "80", "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("name", ["corehandler.1", "corehandler.toml.5", "csplice.8"])
def test_pages_render_without_warnings(pages, name, tmp_path):
    path = tmp_path / name
    path.write_text(pages[name])
    got = rendered(path)
    assert got.returncode == 0 and got.stderr == "", got.stderr


def test_corehandler_1_documents_every_verb_and_option(pages):
    text = pages["corehandler.1"].replace("\\-", "-").replace("\\e", "\\")
    globals_, verbs = argtree.tree(build_parser()[0])
    flags = [f for o in globals_ for f in o.flags]
    for verb in verbs:
        assert f".SS {' | '.join((verb.name, *verb.aliases))}" in text
        flags += [f for o in verb.options for f in o.flags]
        for sub in verb.verbs:
            assert f"\\fB{verb.name} {sub.name}\\fR" in text
            flags += [f for o in sub.options for f in o.flags]
    for flag in flags:
        assert f"\\fB{flag}\\fR" in text, flag
    assert {"debug", "gdb", "list", "info", "dump", "vacuum", "install", "fleet"} <= \
        {n for v in verbs for n in (v.name, *v.aliases)}
    for section in ("MATCH", "EXIT STATUS", "ENVIRONMENT", "FILES", "SEE ALSO"):
        assert f".SH {section}\n" in text
    for name in ("$SYSTEMD_PAGER", "$SYSTEMD_DEBUGGER", "$SYSTEMD_LESS"):
        assert name in text


def test_exit_status_names_every_exit_code():
    codes = {value for name, value in vars(errors).items() if name.startswith("EXIT_")}
    assert set(manpage.EXIT_MEANINGS) == codes


def _shipped_options() -> list[tuple[str | None, str, str]]:
    section, out = None, []
    for line in SHIPPED.read_text().splitlines():
        if m := re.fullmatch(r"\[(\w+)\]", line):
            section = m.group(1)
        elif m := re.fullmatch(r"#(\w+) = (.*)", line):
            out.append((section, m.group(1), m.group(2)))
    return out


def test_corehandler_toml_5_agrees_with_the_shipped_file(pages):
    section, found = None, []
    lines = pages["corehandler.toml.5"].splitlines()
    for i, line in enumerate(lines):
        if line.startswith(".SS "):
            section = None if line == ".SS Top level" else line[5:-1]
        elif m := re.fullmatch(r"\\fB(\w+)\\fR = (.*)", line):
            found.append((section, m.group(1), m.group(2).replace("\\-", "-").replace("\\e", "\\")))
    assert found == _shipped_options()
    assert len(found) > 20


def test_csplice_8_names_what_csplice_takes(pages, csplice):
    text = pages["csplice.8"].replace("\\-", "-")
    args = re.findall(r"^\\fB(%\w)\\fR$", text, re.MULTILINE)
    assert args == SPECIFIERS.split() == list(manpage.SPECIFIER_MEANINGS)
    listed = subprocess.run([str(csplice), "--list-settings"], capture_output=True, text=True, check=True).stdout
    keys = [line.split("=", 1)[0] for line in listed.splitlines() if "=" in line and not line.startswith("#")]
    documented = re.findall(r"^\\fB(\w+)\\fR(?: \(default .*\))?$", text.split(".SH SETTINGS")[1].split(".SH ")[0],
                            re.MULTILINE)
    assert documented == keys


def test_install_docs_puts_them_where_man_finds_them(tmp_path):
    share = tmp_path / "share"
    subprocess.run([str(ROOT / "packaging" / "install-docs.sh"), sys.executable, str(share), "zsh/site-functions"],
                   check=True, capture_output=True, timeout=120)
    for name, first in (("corehandler", "COREHANDLER(1)"), ("corehandler.toml", "COREHANDLER.TOML(5)"),
                        ("csplice", "CSPLICE(8)")):
        got = subprocess.run(["man", "-M", str(share / "man"), name], capture_output=True, text=True,
                             env={"MANWIDTH": "80", "PAGER": "cat", "PATH": "/usr/bin:/bin"})
        assert got.returncode == 0 and got.stdout.lstrip().startswith(first), (name, got.stderr)
    assert (share / "bash-completion" / "completions" / "corehandler").read_text() == \
        completion.bash(build_parser()[0])
    assert (share / "zsh" / "site-functions" / "_corehandler").read_text().startswith("#compdef corehandler\n")


def test_paths_in_files_section_are_the_real_ones():
    text = manpage.corehandler_1(build_parser()[0])
    assert str(paths.DEFAULT_STATE_DIR) in text and str(paths.DEFAULT_CONFIG_DIR) in text
