"""The progress bar of `dump` and `fleet get`: drawn on a terminal, silent otherwise."""

from __future__ import annotations

import io

from corehandler.cli.progress import Progress


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_no_bar_when_stderr_is_not_a_terminal():
    out = io.StringIO()
    with Progress(100, "x", out) as p:
        p(50)
        p(50)
    assert out.getvalue() == ""


def test_a_terminal_gets_a_bar_that_ends_with_its_line(monkeypatch):
    out = Tty()
    ticks = iter(range(0, 1000))
    monkeypatch.setattr("corehandler.cli.progress.time.monotonic", lambda: next(ticks) * 1.0)
    with Progress(4 << 20, "1700-abc-1", out) as p:
        p(1 << 20)
        p(3 << 20)
    text = out.getvalue()
    assert text.startswith("\r1700-abc-1 [") and text.endswith("\n")
    assert "  25% 1M/4M " in text and " 100% 4M/4M " in text
    assert text.count("\n") == 1
