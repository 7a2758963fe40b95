"""The command line as data: every verb, sub-verb, option and argument of the argparse tree cli.build_parser
makes, for what is generated from it (the corehandler(1) man page, bash and zsh completion), so none of them
lists an option by hand."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]          # ("-o", "--output"); () for a positional
    name: str                       # the metavar (or dest) a value is shown as
    help: str
    takes_value: bool
    choices: tuple[str, ...] = ()
    many: bool = False              # a positional that takes several words (MATCH ...)
    inline: tuple[str, ...] = ()    # values a flag may take after '=' (--json=short), none after a space
    words: tuple[str, ...] = ()     # what a word of this positional starts with (MATCH: pid=, COREDUMP_UNIT=)


@dataclass(frozen=True)
class Verb:
    name: str
    help: str
    aliases: tuple[str, ...] = ()
    options: tuple[Option, ...] = ()
    positionals: tuple[Option, ...] = ()
    verbs: tuple[Verb, ...] = field(default=())


def _option(action: argparse.Action, actions: list[argparse.Action]) -> Option:
    takes_value = action.nargs != 0
    metavar = action.metavar if isinstance(action.metavar, str) else (action.dest.upper() if takes_value else "")
    return Option(flags=tuple(action.option_strings), name=metavar, help=" ".join((action.help or "").split()),
                  takes_value=takes_value, choices=tuple(map(str, action.choices or ())),
                  many=action.nargs in ("*", "+", argparse.REMAINDER), inline=_inline(action, actions),
                  words=tuple(getattr(action, "completions", ())))


def _inline(action: argparse.Action, actions: list[argparse.Action]) -> tuple[str, ...]:
    """The values of a flag that also takes one after '=': argparse cannot have a value that is optional only
    after '=' (an optional one swallows the next word), so the `--flag=VALUE` form is a hidden option of the
    same dest with the choices, which cli.main spells it as (common.coredumpctl_argv)."""
    if action.nargs != 0 or not action.option_strings:
        return ()
    for other in actions:
        if other is not action and other.dest == action.dest and other.help is argparse.SUPPRESS and other.choices:
            return tuple(map(str, other.choices))
    return ()


def _shown(action: argparse.Action) -> bool:
    return action.help is not argparse.SUPPRESS and not isinstance(action, (argparse._HelpAction,
                                                                              argparse._VersionAction))


def _verbs(parser: argparse.ArgumentParser, inherited: set[str]) -> tuple[Verb, ...]:
    found = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {pseudo.dest: pseudo.help or "" for pseudo in action._choices_actions}
        for name, sub in action.choices.items():
            if name not in helps:  # an alias: listed with its verb
                continue
            aliases = tuple(a for a, p in action.choices.items() if p is sub and a != name)
            own = [a for a in sub._actions if _shown(a) and a.dest not in inherited
                   and not isinstance(a, argparse._SubParsersAction)]
            found.append(Verb(name=name, help=" ".join(helps[name].split()), aliases=aliases,
                              options=tuple(_option(a, sub._actions) for a in own if a.option_strings),
                              positionals=tuple(_option(a, sub._actions) for a in own if not a.option_strings),
                              verbs=_verbs(sub, inherited)))
    return tuple(found)


def tree(parser: argparse.ArgumentParser) -> tuple[tuple[Option, ...], tuple[Verb, ...]]:
    """(the global options, the verbs) of the parser cli.build_parser made."""
    shown = [a for a in parser._actions if _shown(a) and not isinstance(a, argparse._SubParsersAction)]
    inherited = {a.dest for a in parser._actions}
    return tuple(_option(a, parser._actions) for a in shown), _verbs(parser, inherited)
