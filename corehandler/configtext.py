"""The config shown as text: the shipped config/corehandler.toml (every option commented out with its default
and its description), `config show` (TOML in human units, or JSON with parsed values) and the man page's table
of settings. The models are the documentation: each field's description is the comment above it."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from corehandler import units
from corehandler.config import Config, Human, toml_value


def _fields(model: BaseModel) -> list[tuple[str, str, str]]:
    """(key, value as TOML in human units, description) of a section's options."""
    out = []
    for name, info in type(model).model_fields.items():
        if isinstance(getattr(model, name), BaseModel):
            continue
        value = getattr(model, name)
        human = next((m for m in info.metadata if isinstance(m, Human)), None)
        out.append((name, toml_value(human.format(value) if human else value), info.description or ""))
    return out


def documented(config: Config) -> list[tuple[str | None, list[tuple[str, str, str]]]]:
    """Every option as the shipped file and corehandler.toml(5) show it: (section, its (key, value,
    description)), the top level (section None) first."""
    sections = [(name, getattr(config, name)) for name in type(config).model_fields]
    return [(None, _fields(config))] + [(name, _fields(s)) for name, s in sections if isinstance(s, BaseModel)]


def _field_lines(fields: list[tuple[str, str, str]], commented: bool) -> list[str]:
    lines = []
    for name, text, description in fields:
        if commented:
            lines += [f"# {description}", f"#{name} = {text}"]
        else:
            lines.append(f"{name} = {text}")
    return lines


DEFAULTS_HEADER = """\
# corehandler configuration. Every option is shown commented out with its default; uncomment to change it.
# Drop-ins in corehandler.d/*.toml are read after this file, in name order; a later file wins key by key.
# Sizes are binary ("64K", "4G", "1.5GiB"), durations "90s", "1h30m", "2w"; "15%" is a share of a filesystem.
# `corehandler config check` validates it; `corehandler config show` prints what is in effect."""


def render_toml(config: Config, *, commented_defaults: bool = False) -> str:
    """The config as TOML in human units. commented_defaults renders the shipped file's form."""
    out = [DEFAULTS_HEADER] if commented_defaults else []
    for section, fields in documented(config):
        out.append("\n".join(([f"[{section}]"] if section else []) + _field_lines(fields, commented_defaults)))
    return "\n\n".join(out) + "\n"


def config_json(config: Config) -> dict:
    """The config with parsed values: sizes in bytes, durations in seconds, SizeOrPercent as "15%" or bytes."""
    def plain(value):
        if isinstance(value, BaseModel):
            return {name: plain(getattr(value, name)) for name in type(value).model_fields}
        if isinstance(value, units.SizeOrPercent):
            return value.bytes if value.bytes is not None else units.format_percent(value.percent)
        if isinstance(value, Path):
            return str(value)
        return value

    return plain(config)
