"""Shell completion as users get it: the generated bash and zsh scripts, loaded by the real bash and by the real
zsh's completion system (compinit, in `zsh -f` on a pseudo-terminal), asked for partial command lines, offer
what the argparse tree has: verbs, a verb's options, option values (`--mode `, `--json=`), the KIND= starts of
MATCH words. Every expectation is read from the tree (cli/argtree.py), not written here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from corehandler.cli import argtree, build_parser, completion
from corehandler.cli.common import JSON_MODES
from corehandler.cli.selection import MATCH_KEYS
from support import shellcomplete

GLOBALS, VERBS = argtree.tree(build_parser()[0])
VERB = {n: v for v in VERBS for n in (v.name, *v.aliases)}
SHELLS = ["bash", pytest.param("zsh", marks=pytest.mark.skipif(shutil.which("zsh") is None,
                                                               reason="zsh is in scripts/apt/test.txt"))]


def flags(*options) -> set[str]:
    return {f for o in options for f in o.flags}


def choices_of(verb: str, flag: str) -> set[str]:
    (option,) = [o for o in VERB[verb].options if flag in o.flags]
    return set(option.choices)


@pytest.fixture(params=SHELLS)
def offered(request, tmp_path):
    """offered(LINE) -> what the shell completes where LINE ends."""
    parser = build_parser()[0]
    if request.param == "bash":
        script = tmp_path / "corehandler.bash"
        script.write_text(completion.bash(parser))
        return lambda line: shellcomplete.bash(script, line)
    script = completion.zsh(parser)
    return lambda line: shellcomplete.zsh(script, line, tmp_path / "zsh")


def words(got: set[str]) -> set[str]:
    """The offered words that are not options (bash offers options in every word, zsh after a '-')."""
    return {w for w in got if not w.startswith("-")}


def test_verbs(offered):
    assert words(offered("corehandler ")) == set(VERB)
    assert offered("corehandler de") == {n for n in VERB if n.startswith("de")}
    assert offered("corehandler --no-pager g") == {"gdb"}


def test_options_of_a_verb(offered):
    # Long options that take a value also come as `--flag=`; `--json=` is --json's own.
    got = {w.removesuffix("=") for w in offered("corehandler list -")}
    assert got == flags(*GLOBALS, *VERB["list"].options)
    assert offered("corehandler list --re") == {"--reverse"}
    assert {w.removesuffix("=") for w in offered("corehandler --no-pager gdb --deb")} == \
        {"--debugger", "--debugger-arguments"}


def test_sub_verbs_and_their_options(offered):
    assert words(offered("corehandler config ")) == {s.name for s in VERB["config"].verbs}
    (show,) = [s for s in VERB["config"].verbs if s.name == "show"]
    assert "--csplice" in flags(*show.options)
    assert offered("corehandler config show --cs") == {"--csplice"}


def test_option_values(offered, tmp_path):
    assert offered("corehandler install --mode ") == choices_of("install", "--mode")
    assert offered("corehandler install --mode=s") == {"socket"}
    # A time: nothing to guess, and neither an option nor a MATCH word.
    assert offered("corehandler list --since ") == set()
    assert offered("corehandler list --since=") == set()
    (tmp_path / "statedir").mkdir()
    (tmp_path / "statefile").touch()
    # (bash offers the whole path, zsh its last component)
    assert {Path(w.rstrip("/")).name for w in offered(f"corehandler --state-dir {tmp_path}/state")} == {"statedir"}


def test_json_modes_after_the_equals_sign(offered):
    assert offered("corehandler --json=") == set(JSON_MODES)
    assert offered("corehandler list --json=p") == {m for m in JSON_MODES if m.startswith("p")}
    # --json alone takes no value: the word after it is the verb.
    assert offered("corehandler --json li") == {"list"}


def test_match_words(offered):
    assert MATCH_KEYS and all(k.endswith("=") for k in MATCH_KEYS)
    assert words(offered("corehandler info ")) == set(MATCH_KEYS)
    assert offered("corehandler dump COREDUMP_U") == {k for k in MATCH_KEYS if k.startswith("COREDUMP_U")}
    assert offered("corehandler debug co") == {"comm="}
    # The value of a FIELD= is the user's: neither a verb, an option nor another field.
    assert offered("corehandler info COREDUMP_UNIT=ngi") == set()


def test_every_verb_with_matches_offers_the_match_keys():
    for verb in VERBS:
        if verb.positionals and any(p.words for p in verb.positionals):
            assert {w for p in verb.positionals for w in p.words} == set(MATCH_KEYS)
    assert {v.name for v in VERBS if any(p.words for p in v.positionals)} >= {"list", "info", "dump", "debug"}

