"""The analyser's own system user: the uid and gid the unwinder runs as (jail.py), owning no file and in no
group, so that a core that takes the unwinder over finds nothing of ours writable and nothing of root's
readable. `corehandler install` (and through it scripts/setup and the Debian package) makes it; so do the
tests that run an analysis as root, the same way."""

from __future__ import annotations

import pwd
import shutil
import subprocess

NAME = "corehandler-analysis"


def lookup() -> dict | None:
    """{"uid", "gid"} of the analyser's user, None when it does not exist."""
    try:
        entry = pwd.getpwnam(NAME)
    except KeyError:
        return None
    return {"uid": entry.pw_uid, "gid": entry.pw_gid}


def ensure() -> dict:
    """Makes the user (a system uid, its own group, no home, no shell) unless it exists; returns lookup()."""
    found = lookup()
    if found is not None:
        return found
    useradd = shutil.which("useradd", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if useradd is None:
        raise OSError(f"cannot create the user {NAME}: useradd not found (apt-get install passwd)")
    done = subprocess.run([useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                           "--shell", "/usr/sbin/nologin", "--comment", "corehandler crash analyser", NAME],
                          capture_output=True, text=True)
    found = lookup()
    if found is None:
        raise OSError(f"cannot create the user {NAME}: {done.stderr.strip() or f'useradd exited {done.returncode}'}")
    return found
