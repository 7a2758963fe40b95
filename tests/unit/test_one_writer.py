"""One writer of host state (issue 33): core_pattern, core_pipe_limit, our sysctl.d file and csplice.conf are
written by corehandler/host/handler.py alone, in the product, the tests and the benchmarks alike. Everyone else
borrows (handler.borrow), claims (install) or releases (uninstall) through it.

The check reads the code, not a list: a function (or a module's top level) that both names host state and
writes, removes or replaces a file is a writer. A test that writes a fake kernel's tree under tmp_path says so
on the line (or a comment line above it), with `# not the host's: WHY`, and a stand-in for another party that
takes the handler (apt's systemd-coredump) with `# another party's: WHY`; the reason is required.

Two writers in shell stand outside Python by necessity, each held to its own test: debian/corehandler.postrm,
which runs when the package's Python is gone (its owner rule: tests/local/test_debian_rule.py), and
scripts/install-deps, which puts back what apt's systemd-coredump postinst changed before any Python of ours
exists (tests/system/test_install_deps.py).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THE_WRITER = ROOT / "corehandler" / "host" / "handler.py"
PRAGMA = re.compile(r"#\s*(not the host's|another party's):\s*\S")

# What names host state: the files' names and the identifiers that hold them.
HOST_TEXT = ("core_pattern", "core_pipe_limit", "csplice.conf", "sysctl.d", "50-corehandler.conf", "/proc/sys")
HOST_NAMES = {"CORE_PATTERN", "CORE_PIPE_LIMIT", "CSPLICE_SETTINGS", "csplice_settings", "sysctl_d",
              "SYSCTL_D_NAME", "sysctl_d_file", "sysctl_root", "settings_file"}
# What writes: methods and functions that create, replace or remove a file (the target: the receiver of a
# method, a function's first argument, the destination of a copy), and shell that does.
WRITE_METHODS = {"write_text", "write_bytes", "unlink", "rename", "symlink_to", "touch", "hardlink_to", "rmdir"}
WRITE_FUNCS = {"write_atomic": 0, "copy": 1, "copyfile": 1, "copy2": 1, "move": 1, "truncate": 0, "symlink": 1,
               "replace": 1}
SHELL_WRITES = re.compile(r"sysctl\s+-w|>\s*/proc/sys|tee\s+/proc/sys")


def sources() -> list[Path]:
    return sorted(p for d in ("corehandler", "tests", "bench") for p in (ROOT / d).rglob("*.py"))


def _target(call: ast.Call) -> ast.AST | None:
    """What a call writes, or None when it writes no file."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if isinstance(func, ast.Attribute) and name in WRITE_METHODS:
        return func.value
    if name == "open":
        if isinstance(func, ast.Name):  # open(path, mode)
            mode = call.args[1] if len(call.args) > 1 else next(
                (k.value for k in call.keywords if k.arg == "mode"), None)
            writing = isinstance(mode, ast.Constant) and isinstance(mode.value, str) and \
                bool(set(mode.value) & set("wax+"))
        else:  # os.open(path, flags)
            writing = any(flag in ast.dump(call) for flag in ("O_WRONLY", "O_RDWR", "O_TRUNC", "O_CREAT"))
        return call.args[0] if writing and call.args else None
    if name in WRITE_FUNCS and len(call.args) > WRITE_FUNCS[name]:
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
        if name == "write_atomic" or owner in ("os", "shutil"):
            return call.args[WRITE_FUNCS[name]]
    return None


def _names_host(node: ast.AST, tainted: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and any(t in sub.value for t in HOST_TEXT):
            return True
        if isinstance(sub, ast.Attribute) and sub.attr in HOST_NAMES:
            return True
        if isinstance(sub, ast.Name) and (sub.id in HOST_NAMES or sub.id in tainted):
            return True
    return False


def _shell(node: ast.AST) -> bool:
    """A shell line or an argv that writes a sysctl."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return bool(SHELL_WRITES.search(node.value))
    if isinstance(node, (ast.List, ast.Tuple)):
        words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return bool(SHELL_WRITES.search(" ".join(words)))
    return False


def _scopes(tree: ast.Module):
    """The module's top level and each function, each without the functions nested in it."""
    def own(body):
        stack = list(body)
        while stack:
            node = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            yield node
            stack.extend(ast.iter_child_nodes(node))

    yield list(own(tree.body))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defaults = [d for d in node.args.defaults + node.args.kw_defaults if d is not None]
            yield list(own(node.body)) + list(own(defaults))


def writers(path: Path, text: str | None = None) -> list[str]:
    text = path.read_text() if text is None else text
    lines = text.splitlines()
    found = []
    for scope in _scopes(ast.parse(text)):
        # A name given host state in this scope (`target = paths.CSPLICE_SETTINGS`, `for name in SYSCTLS`)
        # names it wherever it is used; twice, for a name made from another.
        tainted: set[str] = set()
        for _ in range(2):
            for node in scope:
                if isinstance(node, (ast.Assign, ast.For, ast.withitem, ast.NamedExpr, ast.AnnAssign)):
                    value = next((getattr(node, f) for f in ("value", "iter", "context_expr")
                                  if getattr(node, f, None) is not None), None)
                    targets = getattr(node, "targets", None) or [getattr(node, "target", None)
                                                                 or getattr(node, "optional_vars", None)]
                    if value is not None and _names_host(value, tainted):
                        # Plain names only: `self.kernel = ...` taints no `self`.
                        tainted |= {n.id for t in targets if t is not None
                                    for n in ([t] if isinstance(t, ast.Name) else getattr(t, "elts", []))
                                    if isinstance(n, ast.Name)}
        for node in scope:
            target = _target(node) if isinstance(node, ast.Call) else None
            if (target is not None and _names_host(target, tainted)) or _shell(node):
                line = lines[node.lineno - 1]
                above = lines[node.lineno - 2] if node.lineno > 1 else ""
                if not PRAGMA.search(line) and not (above.lstrip().startswith("#") and PRAGMA.search(above)):
                    found.append(f"{path.relative_to(ROOT) if path.is_absolute() else path}:{node.lineno}: "
                                 f"{line.strip()}")
    return sorted(set(found))


def test_nobody_but_host_handler_writes_host_state():
    found = [w for path in sources() if path != THE_WRITER for w in writers(path)]
    assert not found, ("host state written outside corehandler/host/handler.py (borrow, claim or release "
                       "through it; a fake kernel's tree says `# not the host's: WHY`):\n  " + "\n  ".join(found))


@pytest.mark.parametrize("code", [
    'Path("/proc/sys/kernel/core_pattern").write_text(pattern)',
    'paths.CSPLICE_SETTINGS.write_text(text)',
    'write_atomic(host.csplice_settings, data, 0o644)',
    'sysctl.sysctl_d_file(d).unlink()',
    'open("/proc/sys/kernel/core_pipe_limit", "w").write("16")',
    'subprocess.run(["sh", "-c", "echo core > /proc/sys/kernel/core_pattern"])',
    'subprocess.run(["sysctl", "-w", "kernel.core_pattern=core"])',
])
def test_the_check_finds_each_way_of_writing(code):
    """The check itself can fail: each of these, in a function of a file that is not the writer, is found, and a
    fake kernel's tree with its reason is not."""
    assert writers(Path("probe.py"), f"def f(pattern, text, host, paths, data, d):\n    {code}\n"), code
    fake = f"def f(pattern, text, host, paths, data, d):\n    {code}  # not the host's: a fake tree\n"
    assert not writers(Path("probe.py"), fake)


def test_the_writer_is_there_and_writes():
    assert writers(THE_WRITER), "host/handler.py no longer writes host state: the check reads the wrong file"
