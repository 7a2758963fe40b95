"""debian/corehandler.postrm decides, in shell and without Python, whether the package's installation still
owns the kernel's handler: the same rule as host/handler.py's owner() and owns(). The shell's own functions,
taken from the script as it ships, answer here for a table of hosts and for random ones, beside Python's."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

from corehandler.host import handler
from corehandler.paths import Host, Paths

POSTRM = Path(__file__).resolve().parents[2] / "debian" / "corehandler.postrm"
BEGIN, END = "# --- who owns the handler", "# --- end of the rule ---"


def shell_rule() -> str:
    text = POSTRM.read_text()
    return text[text.index(BEGIN):text.index(END)]


def fake_host(tmp_path: Path, pattern: str, settings: str | None, ids: dict[str, str]) -> tuple[Host, Path]:
    kernel = tmp_path / "proc/sys/kernel"
    kernel.mkdir(parents=True, exist_ok=True)
    (kernel / "core_pattern").write_text(pattern + "\n")  # not the host's: a fake kernel under tmp_path
    host = Host(proc_root=tmp_path / "proc", csplice_settings=tmp_path / "lib/corehandler/csplice.conf",
                sysctl_d=tmp_path / "sysctl.d", lock=tmp_path / "lock/x")
    host.csplice_settings.parent.mkdir(parents=True, exist_ok=True)
    if settings is not None:
        host.csplice_settings.write_text(settings)  # not the host's: the fake host's csplice.conf
    for state, ident in ids.items():
        (tmp_path / state).mkdir(parents=True, exist_ok=True)
        (tmp_path / state / "installation-id").write_text(ident + "\n")
    return host, tmp_path / "run/capture.socket"


def in_shell(host: Host, socket: Path, function: str, *args: str) -> tuple[int, str]:
    script = (f"CORE_PATTERN={host.sysctl_root / 'kernel/core_pattern'}\nSETTINGS='{host.csplice_settings}'\n"
              f"SOCKET={socket}\n{shell_rule()}\n{function} \"$@\"\n")
    done = subprocess.run(["sh", "-c", script, "rule", *args], capture_output=True, text=True, timeout=30)
    assert not done.stderr, done.stderr
    return done.returncode, done.stdout.removesuffix("\n")


def both(tmp_path: Path, pattern: str, settings: str | None, ids: dict[str, str], candidates: list[str]):
    host, socket = fake_host(tmp_path, pattern, settings, ids)
    found = handler.owner(host, socket)
    code, printed = in_shell(host, socket, "capture_owner")
    assert code == 0 and printed == ("" if found is None else found.state_dir), (pattern, settings)
    for name in candidates:
        state = str(tmp_path / name)
        python = handler.owns(host, Paths(state_dir=Path(state)), socket)
        shell = in_shell(host, socket, "owned_by", state)[0] == 0
        assert python == shell, (pattern, settings, ids, name, python)


CSPLICE = "|/usr/libexec/corehandler/csplice %P %i %I %u %g %d %s %t %c %h %e"


@pytest.mark.parametrize("pattern, settings, ids", [
    ("core", None, {}),
    ("|/lib/systemd/systemd-coredump %P %u %g %s %t 9223372036854775808 %h %d", None, {}),
    (CSPLICE, None, {}),  # csplice on its built-in spool: csplice.conf's own directory
    (CSPLICE, "owner={T}/a\ninstallation=1111\n", {"a": "1111"}),
    (CSPLICE, "owner={T}/a\ninstallation=1111\n", {"a": "2222"}),  # a state dir made anew
    (CSPLICE, "owner={T}/a\n", {"a": "1111"}),
    (CSPLICE, "spool_dir={T}/a/spool\nmax_pending=3\n", {}),  # v0.3's file
    (CSPLICE, "spool_dir={T}/a/spool/\n", {}),
    (CSPLICE, "owner=\nspool_dir={T}/b/spool\n", {}),
    (CSPLICE, "  owner={T}/a\n# owner={T}/b\nowner={T}/b\n", {}),  # the last one counts, comments do not
    (CSPLICE, "max_pending=3\n", {}),
    ("|/opt/x/libexec/csplice", "owner={T}/my state\n", {}),
    ("|csplice %P", "owner={T}/a\n", {}),
    ("|/opt/x/csplice-static %P", "owner={T}/a\n", {}),
    ("/var/crash/csplice", "owner={T}/a\n", {}),  # a file pattern named like it
    ("@@{T}/run/capture.socket", "owner={T}/a\n", {}),
    ("@{T}/run/capture.socket", "owner={T}/a\n", {}),
    ("@@/run/systemd/coredump", "owner={T}/a\n", {}),
])
def test_the_shell_and_python_agree(tmp_path, pattern, settings, ids):
    t = str(tmp_path)
    both(tmp_path, pattern.replace("{T}", t), None if settings is None else settings.replace("{T}", t), ids,
         ["a", "b", "lib/corehandler", "my state"])


def test_they_agree_on_random_hosts(tmp_path):
    rng = random.Random(33)
    t = str(tmp_path)
    patterns = ["core", CSPLICE, "|/x/csplice", "|/x/csplicer %P", f"@@{t}/run/capture.socket", "|/x/csplice  "]
    lines = [f"owner={t}/a", f"owner={t}/b", "owner=", "installation=1111", "installation=2222", "installation=",
             f"spool_dir={t}/a/spool", f"spool_dir={t}/b/spool", " owner=" + t + "/a", "# owner=/nope", "strategy=rw"]
    for i in range(40):
        settings = None if rng.random() < 0.15 else "".join(rng.choice(lines) + "\n" for _ in range(rng.randint(0, 5)))
        ids = {name: rng.choice(["1111", "2222"]) for name in ("a", "b") if rng.random() < 0.7}
        both(tmp_path / str(i), rng.choice(patterns).replace(t, str(tmp_path / str(i))),
             None if settings is None else settings.replace(t, str(tmp_path / str(i))), ids,
             ["a", "b", "lib/corehandler"])
