"""docs/design.md's module map is the tree as it stands: every module is named once, under its folder."""

import re
from pathlib import Path

import corehandler

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def _map() -> dict[str, set[str]]:
    text = DESIGN.read_text()
    section = text[text.index("## Python control plane (`corehandler/`)"):text.index("### Configuration")]
    folders: dict[str, set[str]] = {"": set()}
    current = ""
    for line in section.splitlines():
        if m := re.match(r"^`(\w+)/`:", line):
            current = m.group(1)
            folders.setdefault(current, set())
        folders[current] |= set(re.findall(r"`(\w+)\.py`", line)) - {"__init__"}
    return folders


def _tree() -> dict[str, set[str]]:
    root = Path(corehandler.__file__).parent
    tree: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        if path.name == "__init__.py" or path.name.startswith("_libexec"):
            continue
        folder = "" if path.parent == root else path.parent.name
        tree.setdefault(folder, set()).add(path.stem)
    return tree


def test_every_module_is_in_the_map_under_its_folder_and_nothing_else_is():
    assert _map() == _tree()


def test_every_csplice_file_is_in_the_map_and_nothing_else_is():
    text = DESIGN.read_text()
    section = text[text.index("### csplice's files"):text.index("## Socket mode (")]
    named = set(re.findall(r"`(\w+)\.c`", section))
    on_disk = {path.stem for path in (DESIGN.parents[1] / "csplice").glob("*.c")}
    assert named == on_disk


def test_every_source_path_the_docs_and_comments_name_exists():
    """A file that moved takes its mentions along: docs, comments and docstrings name files that are there."""
    root = DESIGN.parents[1]
    texts = [root / "README.md", *root.joinpath("docs").glob("*.md")]
    for folder in ("corehandler", "csplice", "tests", "bench", "packaging", "scripts"):
        texts += [p for p in root.joinpath(folder).rglob("*") if p.suffix in (".py", ".c", ".h", ".md", ".sh")]
    mention = re.compile(r"\b((?:corehandler|csplice|tests|bench)/[\w/]+\.(?:py|c|h))\b")
    named = {m for path in texts for m in mention.findall(path.read_text(errors="replace"))}
    assert sorted(p for p in named if not (root / p).exists()) == []
