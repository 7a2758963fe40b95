"""A pager for what the CLI prints on a terminal, chosen as systemd's tools choose one (coredumpctl,
journalctl; systemd's src/shared/pager.c): $SYSTEMD_PAGER, else $PAGER, else less, else more; "" or "cat"
means none. less gets $SYSTEMD_LESS as its LESS (default FRSXMK: quit if one screen, raw colours, chop long
lines, no init, long prompt, quit on Ctrl-C). Never when --no-pager is given, stdout is not a terminal, or the
terminal is dumb ($TERM unset or "dumb", as systemd checks): a maintainer script under apt has a terminal of
sorts, and a pager there would wait for a key nobody presses. Only the verbs that show dumps page
(cli/common.emit's `pager` default, set by list and info).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

DEFAULT_LESS = "FRSXMK"


def command(environ: os._Environ | dict = os.environ) -> list[str] | None:
    """The pager to run, as an argv; None for none."""
    for name in ("SYSTEMD_PAGER", "PAGER"):
        chosen = environ.get(name)
        if chosen is not None:
            chosen = chosen.strip()
            if chosen in ("", "cat"):
                return None
            # A command with arguments goes through the shell, as systemd passes it ("less -R", "most -s").
            return ["sh", "-c", chosen] if any(c.isspace() for c in chosen) else [chosen]
    for fallback in ("less", "more"):
        if shutil.which(fallback):
            return [fallback]
    return None


def _dumb_terminal() -> bool:
    return os.environ.get("TERM", "dumb") in ("", "dumb")


def show(text: str, no_pager: bool = False) -> None:
    """Prints text (a newline added), through the pager when stdout is a terminal."""
    argv = None if no_pager or not sys.stdout.isatty() or _dumb_terminal() else command()
    if argv is None:
        print(text)
        return
    env = dict(os.environ, LESS=os.environ.get("SYSTEMD_LESS", DEFAULT_LESS))
    sys.stdout.flush()
    try:
        pager = subprocess.Popen(argv, stdin=subprocess.PIPE, env=env)
    except OSError:  # the pager named cannot run: the text still matters more
        print(text)
        return
    try:
        pager.stdin.write((text + "\n").encode("utf-8", "surrogateescape"))
        pager.stdin.close()
    except BrokenPipeError:  # the reader quit the pager before the end: done, as with `| head`
        pass
    pager.wait()
