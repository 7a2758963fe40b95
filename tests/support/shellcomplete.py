"""Ask the real bash and zsh what they complete for a partial `corehandler ...` command line, with the
completion scripts corehandler.cli.completion generates.

bash: the words split as readline splits them (at blanks, and at '=' as COMP_WORDBREAKS says), COMP_WORDS and
COMP_CWORD set, and the function called with the arguments bash gives it ($1 the command, $2 the word being
completed, which after a '=' is what follows it).

zsh: an interactive `zsh -f` on a pseudo-terminal (zsh/zpty) with compinit and the script in $fpath, the line
typed and TAB pressed; the completion system runs as for a user, and what it offers is read by wrapping compadd
(as zsh's own test harness for completion does), so the words are zsh's matches after its own matching."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from shlex import quote

# Typed into the pseudo-terminal's shell: the setup it sources, then the line and a TAB.
ZSH_SETUP = r"""
PS1='' RPS1=''
fpath=(%(dir)s $fpath)
autoload -Uz compinit && compinit -u -D
bindkey -e '^I' complete-word
compadd() {
    # Calls that only ask (-O, -A, -D) are the completion system's own bookkeeping.
    if (( ${@[(I)-[OAD]]} )); then builtin compadd "$@"; return; fi
    local -a __words
    builtin compadd -O __words "$@"
    (( $#__words )) && print -rl -- "${__words[@]}" >> %(out)s
    builtin compadd "$@"
}
_completion_done() { print -r -- "<<""DONE>>" }
comppostfuncs=(_completion_done)
"""
ZSH_DRIVER = r"""
zmodload zsh/zpty || exit 3
zpty shell zsh -f -i
zpty -w shell "source ${(q)1}"
zpty -w -n shell "$2"$'\t'
zpty -r shell reply '*<<DONE>>*'
zpty -d shell
"""


def zsh(script: str, line: str, tmp: Path) -> set[str]:
    """What the real zsh offers for LINE (ending where TAB is pressed) with the completion SCRIPT."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "_corehandler").write_text(script)
    out = tmp / "offered"
    out.unlink(missing_ok=True)
    setup = tmp / "setup.zsh"
    setup.write_text(ZSH_SETUP % {"dir": tmp, "out": out})
    subprocess.run(["zsh", "-f", "-c", ZSH_DRIVER, "driver", str(setup), line], check=True, capture_output=True,
                   timeout=120)
    return set(out.read_text().splitlines()) if out.exists() else set()


def readline_words(line: str) -> list[str]:
    """LINE split as readline splits it for COMP_WORDS: at blanks, with each '=' a word of its own."""
    words = [w for part in line.split() for w in re.split(r"(=)", part) if w]
    return words + [""] if line.endswith(" ") or not words else words


def bash(script: Path, line: str) -> set[str]:
    """What the real bash's completion function offers for LINE (ending where TAB is pressed)."""
    words = readline_words(line)
    cur = "" if words[-1] == "=" else words[-1]
    program = (f"source {quote(str(script))}; COMP_WORDS=({' '.join(map(quote, words))}); "
               f"COMP_CWORD={len(words) - 1}; _corehandler corehandler {quote(cur)} {quote(words[-2])}; "
               "printf '%s\\n' \"${COMPREPLY[@]}\"")
    out = subprocess.run(["bash", "--norc", "-c", program], capture_output=True, text=True, check=True).stdout
    return {w for w in out.splitlines() if w}
