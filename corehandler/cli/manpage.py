"""The man pages, generated: corehandler(1) from the argparse tree (cli/argtree.py), corehandler.toml(5) from
the config models (the same source as the shipped config/corehandler.toml), csplice(8) from the C side's
contract (its specifiers, its settings: the [capture] models). Nothing here lists an option by hand, so a
new verb, option or setting is documented the moment it exists.

    python -m corehandler.cli.manpage DIR     writes DIR/corehandler.1, DIR/corehandler.toml.5, DIR/csplice.8
"""

from __future__ import annotations

import sys
from pathlib import Path

from corehandler import __version__, errors
from corehandler.cli import argtree
from corehandler.cli.selection import MATCH_HELP, TIME_HELP
from corehandler.config import Config
from corehandler.configtext import documented
from corehandler.csplice_contract import (
    INSTALLATION_KEY,
    OWNER_KEY,
    SPECIFIERS,
    STOCK_KERNEL_STRATEGY,
    STRATEGIES,
    Facts,
    settings_values,
)
from corehandler.paths import Paths

# What each of csplice's specifiers is (core(5)); a test keeps the keys equal to SPECIFIERS.
SPECIFIER_MEANINGS = {
    "%P": "the PID of the crashed process in the initial PID namespace",
    "%i": "the TID of the thread that crashed, in the initial PID namespace",
    "%I": "the TID in the initial PID namespace (the same, from the kernel's other table)",
    "%u": "the real UID of the process",
    "%g": "the real GID of the process",
    "%d": "its dump mode (1 ordinary, 0 or 2 for setuid and non-dumpable processes; only 1 is shown to users)",
    "%s": "the signal that caused the dump",
    "%t": "the time of the dump, in seconds since the Epoch",
    "%c": "the soft RLIMIT_CORE of the process (0 keeps metadata only, as the kernel keeps no core file)",
    "%h": "the hostname (the process's UTS namespace)",
    "%e": "the process's comm (the kernel shows a '/' in it as '!')",
}

# What each exit code of the CLI means (errors.py's EXIT_* constants); a test keeps them equal.
EXIT_MEANINGS = {
    errors.EXIT_OK: "success",
    errors.EXIT_NOMATCH: "nothing matched; for why: a crash now would not keep a full core (or the dump has none)",
    errors.EXIT_USAGE: "usage: a bad option, argument or MATCH word",
    errors.EXIT_CONFIG: "the configuration is invalid (the message names the file, key and value)",
    errors.EXIT_PERMISSION: "permission: not root, a store the user may not read, or a csplice path someone "
                            "else could change",
    errors.EXIT_CONFLICT: "another core handler is installed (install without --force), or the supervised "
                          "daemon is not running",
    errors.EXIT_SYSTEM: "a system call failed, or a stored dump is corrupt (info, dump, debug)",
    errors.EXIT_INDEX_NEWER: "the index was written by a newer corehandler (a downgrade): restore the backup the "
                             "message names or install that version again; the daemon is not restarted",
    errors.EXIT_INDEX_OLDER: "the index was written by an older corehandler and not migrated yet: the daemon "
                             "migrates it when it starts, or run corehandler migrate",
}

CSPLICE_EXITS = {
    0: "a record was committed (complete, truncated or metadata only)",
    64: "usage: not started the way the kernel starts it (no arguments, %P not a live PID, stdin not a pipe, or a "
        "socket peer that is not a task being dumped); nothing was stored",
    73: "the spool could not be opened or written: the dump was drained and lost (see the kernel log)",
    74: "the record could not be committed",
}

ENVIRONMENT = [
    ("$SYSTEMD_PAGER, $PAGER", "the pager for output on a terminal, as systemd's tools choose it (SYSTEMD_PAGER "
     "first); \"cat\" or an empty value means none; without either, less, else more"),
    ("$SYSTEMD_LESS", "the LESS options the pager gets (default FRSXMK)"),
    ("$COREHANDLER_DEBUGGER, $SYSTEMD_DEBUGGER", "the debugger of debug (gdb) when --debugger is not given "
     "(default gdb)"),
    ("$COREHANDLER_LIBEXEC", "the directory of csplice, for a development build tree"),
]

FILES = [
    ("/etc/corehandler/corehandler.toml", "the configuration, see corehandler.toml(5); drop-ins in "
     "/etc/corehandler/corehandler.d/*.toml"),
    ("/var/lib/corehandler/", "the state directory: spool/ (csplice's captures), store/ (compressed dumps), "
     "index.sqlite, users/ (each user's published view), csplice.conf (csplice's settings, generated)"),
    ("/usr/libexec/corehandler/csplice", "the handler the kernel runs, see csplice(8)"),
    ("/usr/share/corehandler/", "the Grafana dashboard, the Prometheus alert rules and their runbook"),
    ("/run/corehandler/", "socket mode's coredump socket, the supervised daemon's pid files"),
]


def roff(text: str) -> str:
    """Text safe in a roff line: backslashes escaped, hyphens as \\-, no line starting a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text


def _bold(text: str) -> str:
    return f"\\fB{roff(text)}\\fR"


def _option_tag(o: argtree.Option) -> str:
    flags = ", ".join(_bold(f) for f in o.flags)
    if o.inline:
        return f"{flags}[=\\fI{roff('|'.join(o.inline))}\\fR]"
    if not o.takes_value:
        return flags
    value = "{" + ",".join(o.choices) + "}" if o.choices and not o.name else o.name
    return f"{flags} \\fI{roff(value)}\\fR"


def _options(options, positionals=()) -> list[str]:
    out = []
    for o in (*positionals, *options):
        tag = _option_tag(o) if o.flags else f"\\fI{roff(o.name)}\\fR" + (" ..." if o.many else "")
        out += [".TP", tag, roff(o.help or "")]
    return out


def _synopsis(name: str, verb: argtree.Verb) -> str:
    words = [f"[\\fB{roff(o.flags[-1])}\\fR" + (f" \\fI{roff(o.name)}\\fR" if o.takes_value else "") + "]"
             for o in verb.options]
    words += [f"[\\fI{roff(p.name)}\\fR{' ...' if p.many else ''}]" for p in verb.positionals]
    if verb.verbs:
        words.append("{" + "|".join(v.name for v in verb.verbs) + "}")
    return f".B {name}\n" + " ".join(words)


def _header(name: str, section: int, title: str, manual: str) -> list[str]:
    return [f'.TH {name.upper()} {section} "" "corehandler {__version__}" "{manual}"', ".SH NAME",
            f"{roff(name)} \\- {roff(title)}"]


def corehandler_1(parser) -> str:
    globals_, verbs = argtree.tree(parser)
    out = _header("corehandler", 1, "capture, store and inspect core dumps", "User Commands")
    out += [".SH SYNOPSIS", ".B corehandler", "[\\fIOPTIONS\\fR] [\\fIVERB\\fR [\\fIARGS\\fR...]]",
            ".SH DESCRIPTION",
            roff("The kernel pipes every core dump to csplice(8), named in kernel.core_pattern, which copies it "
                 "into the spool and exits, so the crashed process is released at once. corehandler serve (the "
                 "daemon, corehandler.service) validates, analyses, compresses and indexes each dump, applies "
                 "retention, uploads to a fleet bucket when configured, and reports each dump to the journal "
                 "(with systemd-coredump's MESSAGE_ID, so coredumpctl(1) sees them) and to Prometheus."),
            ".PP", roff("With no verb, corehandler lists the stored dumps, as coredumpctl does. Every verb takes "
                        "the global options before or after it."),
            ".SH OPTIONS"]
    out += _options(globals_)
    out += [".SH COMMANDS"]
    for verb in verbs:
        out += [".SS " + roff(" | ".join((verb.name, *verb.aliases))), _synopsis(f"corehandler {verb.name}", verb),
                ".PP", roff(verb.help)]
        out += _options(verb.options, verb.positionals)
        for sub in verb.verbs:
            out += [".TP", _bold(f"{verb.name} {sub.name}"), roff(sub.help)]
            out += [".RS"] + _options(sub.options, sub.positionals) + [".RE"]
    out += [".SH MATCH", roff(f"Verbs that name dumps (list, info, dump, debug) take MATCH words: {MATCH_HELP}."),
            ".PP", roff(f"--since and --until take TIME: {TIME_HELP}.")]
    out += [".SH EXIT STATUS"]
    for code, meaning in sorted(EXIT_MEANINGS.items()):
        out += [".TP", f"\\fB{code}\\fR", roff(meaning)]
    out += [".SH ENVIRONMENT"]
    for name, meaning in ENVIRONMENT:
        out += [".TP", _bold(name), roff(meaning)]
    out += [".SH FILES"]
    for path, meaning in FILES:
        out += [".TP", f"\\fI{roff(path)}\\fR", roff(meaning)]
    out += [".SH SEE ALSO", "\\fBcorehandler.toml\\fR(5), \\fBcsplice\\fR(8), \\fBcoredumpctl\\fR(1), "
            "\\fBcore\\fR(5), \\fBsystemd\\-coredump\\fR(8), \\fBgdb\\fR(1)"]
    return "\n".join(out) + "\n"


def corehandler_toml_5(config: Config | None = None) -> str:
    config = config or Config()
    out = _header("corehandler.toml", 5, "corehandler configuration", "File Formats")
    out += [".SH SYNOPSIS", "\\fI/etc/corehandler/corehandler.toml\\fR",
            ".br", "\\fI/etc/corehandler/corehandler.d/*.toml\\fR",
            ".SH DESCRIPTION",
            roff("One TOML file plus drop-ins, read in name order after it; a later file wins key by key within a "
                 "section. Sizes are binary (\"64K\", \"4G\", \"1.5GiB\"), durations \"90s\", \"1h30m\", \"2w\", "
                 "\"7days\"; \"15%\" is a share of a filesystem. corehandler config check validates the files "
                 "strictly, naming the file, key and value that are wrong; corehandler config show prints what is "
                 "in effect. The shipped file shows every option below commented out with its default."),
            ".SH OPTIONS"]
    for section, fields in documented(config):
        out.append(".SS " + (f"[{roff(section)}]" if section else "Top level"))
        for key, value, description in fields:
            out += [".TP", f"\\fB{roff(key)}\\fR = {roff(value)}", roff(description)]
    out += [".SH SEE ALSO", "\\fBcorehandler\\fR(1), \\fBcsplice\\fR(8)"]
    return "\n".join(out) + "\n"


def csplice_8(config: Config | None = None) -> str:
    config = config or Config()
    capture = {key: (value, description) for section, fields in documented(config) if section == "capture"
               for key, value, description in fields}
    out = _header("csplice", 8, "the core dump handler the kernel runs", "System Administration")
    out += [".SH SYNOPSIS", ".B |/usr/libexec/corehandler/csplice", roff(SPECIFIERS),
            ".br", ".B /usr/libexec/corehandler/csplice", "\\-\\-listen \\fIPATH\\fR ...",
            ".SH DESCRIPTION",
            roff("corehandler install writes kernel.core_pattern so that the kernel runs csplice once per crash "
                 "(pipe mode), with the core on its standard input and the specifiers below as its arguments; "
                 "in socket mode (Linux 6.17+, corehandler install --mode socket) the kernel connects to "
                 "csplice's listener instead, which may refuse a dump before it is written. csplice reads the "
                 "process's /proc entry first, while the process is still there, decides whether to keep the "
                 "dump (size, free space, crash storms), copies it into the spool with the capture strategy "
                 f"chosen for this kernel ({', '.join(STRATEGIES)}), commits a JSON record beside it, and exits; "
                 "the corehandler daemon does everything slower afterwards. It runs as root with no environment; "
                 "it never follows a name the crashing process chose."),
            ".SH ARGUMENTS", roff("In csplice's argv order (core(5)):")]
    for spec in SPECIFIERS.split():
        out += [".TP", f"\\fB{roff(spec)}\\fR", roff(SPECIFIER_MEANINGS[spec])]
    out += [".SH SETTINGS",
            roff("csplice reads /var/lib/corehandler/csplice.conf (key=value lines), which the control plane "
                 "generates from the [capture] section of corehandler.toml(5); when it is missing or unreadable "
                 "csplice uses safe built-in defaults and says so in the kernel log. Two more keys, "
                 f"{OWNER_KEY} and {INSTALLATION_KEY}, name the installation (state dir and id) that wrote the "
                 "file; csplice ignores them. The keys:")]
    for key in settings_values(config.capture, Paths().spool_dir, Facts(STOCK_KERNEL_STRATEGY, 0, 0)):
        value, description = capture.get(key, ("", "where records and cores are written (state_dir/spool)"))
        out += [".TP", f"\\fB{roff(key)}\\fR" + (f" (default {roff(value)})" if value else ""), roff(description)]
    out += [".SH OPTIONS", roff("Run by hand with one option, csplice prints a table and exits:"),
            ".TP", "\\fB\\-\\-version\\fR", ".TP", "\\fB\\-\\-list\\-specifiers\\fR",
            roff("the arguments it takes, optional ones in brackets"),
            ".TP", "\\fB\\-\\-list\\-strategies\\fR", ".TP", "\\fB\\-\\-list\\-settings\\fR",
            roff("every csplice.conf key with its built-in default")]
    out += [".SH EXIT STATUS", roff("The kernel ignores them; they are for people running csplice by hand:")]
    for code, meaning in CSPLICE_EXITS.items():
        out += [".TP", f"\\fB{code}\\fR", roff(meaning)]
    out += [".SH SEE ALSO", "\\fBcorehandler\\fR(1), \\fBcorehandler.toml\\fR(5), \\fBcore\\fR(5)"]
    return "\n".join(out) + "\n"


def pages() -> dict[str, str]:
    from corehandler.cli import build_parser  # the package imports the verb modules, which import this one's deps
    parser, _ = build_parser()
    return {"corehandler.1": corehandler_1(parser), "corehandler.toml.5": corehandler_toml_5(),
            "csplice.8": csplice_8()}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m corehandler.cli.manpage DIR", file=sys.stderr)
        return errors.EXIT_USAGE
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        (out / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
