"""packaging/lock/'s files as data: the pins (`name==version`) and the sha256 hashes each carries, in pip's
requirements format as pip-compile writes it (a pin, then `--hash=sha256:...` continuation lines)."""

from __future__ import annotations

import re
from pathlib import Path

LOCK = Path(__file__).resolve().parents[2] / "packaging" / "lock"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})\b")


def canonical(name: str) -> str:
    """A distribution name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def entries(path: Path) -> dict[str, tuple[str, list[str]]]:
    """canonical name -> (version, its sha256 hashes), in the file's order."""
    out: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in path.read_text().splitlines():
        if m := _PIN.match(line):
            current = canonical(m.group(1))
            out[current] = (m.group(2), [])
        elif not line.startswith((" ", "\t")):
            current = None
        if current is not None:
            out[current][1].extend(_HASH.findall(line))
    return out


def pins(path: Path) -> dict[str, str]:
    return {name: version for name, (version, _) in entries(path).items()}
