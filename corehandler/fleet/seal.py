"""age encryption of what leaves the host: the core as a stream, the sidecar's sensitive fields as one blob.

Hosts hold public keys only (`[upload] recipients`, age X25519); whoever reads the bucket without an identity
sees what the fleet view groups by (host, time, exe, signal, signature, sizes, analysis) and nothing of the
process's memory, command line, environment or maps. Objects are plain age files: `age -d -i KEY` opens them.
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import BinaryIO

from corehandler.errors import EXIT_PERMISSION, CorehandlerError

SUFFIX = ".age"
# The sidecar's fields that hold what the process chose or kept in memory (docs/design.md, "Fleet").
SENSITIVE = (("index", "cmdline"), ("record", "proc", "cmdline"), ("record", "proc", "environ"),
             ("record", "proc", "maps"), ("record", "proc", "container", "annotations"))
# age's payload: 64 KiB plaintext chunks, each with a 16-byte tag; the header grows with the recipients.
_CHUNK, _TAG, _HEADER_MAX = 64 << 10, 16, 128 + 256
PIPE_BYTES = 1 << 20  # Linux's default pipe-max-size


class IdentityError(CorehandlerError):
    """No identity given opens this object, or the identity file is unusable."""

    exit_code = EXIT_PERMISSION


def recipients(texts) -> list:
    """The pyrage recipients of age X25519 public keys ("age1..."); ValueError names a bad one."""
    from pyrage import x25519

    out = []
    for text in texts:
        if "AGE-SECRET-KEY-" in text.upper():
            # Not echoed: the message goes to logs.
            raise ValueError("an age private key (AGE-SECRET-KEY-1…) is not a recipient: hosts hold only public "
                             "keys (age1...)")
        try:
            out.append(x25519.Recipient.from_str(text.strip()))
        except Exception:
            raise ValueError(f"{text!r} is not an age X25519 public key (age1...)") from None
    return out


def load_identities(path: Path) -> list:
    """The identities of an age identity file (`age-keygen` output: AGE-SECRET-KEY-1... lines, # comments)."""
    from pyrage import x25519

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise IdentityError(f"identity file {path}: {getattr(e, 'strerror', None) or e}") from None
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            found.append(x25519.Identity.from_str(line))
        except Exception:
            raise IdentityError(f"identity file {path}, line {n}: not an age X25519 identity "
                                "(AGE-SECRET-KEY-1...)") from None
    if not found:
        raise IdentityError(f"identity file {path} holds no age identity")
    return found


def encrypted_size_bound(size: int) -> int:
    """At most how many bytes the age file of `size` plaintext bytes takes (for choosing a part size)."""
    return size + _TAG * (size // _CHUNK + 1) + _HEADER_MAX * 8


class EncryptingReader:
    """A readable stream of the age encryption of a file, made by a child process as it is read (never the
    whole core in memory: a pipe's worth). A child, not a thread: pyrage holds the GIL while it encrypts, and a
    thread of ours doing it starved the upload's own threads (a Python thread counting beside
    pyrage.encrypt_file ran 24x slower). The pipe is widened (PIPE_BYTES) and read unbuffered, whole parts at a
    time: at the default 64 KiB each part took hundreds of wake-ups of both processes. It fails loudly
    rather than end early: a child that did not finish cleanly fails the read that would otherwise have seen
    a short stream."""

    def __init__(self, path: Path, recipients: list):
        with open(path, "rb") as src:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-m", "corehandler.fleet.seal", *(str(r) for r in recipients)],
                stdin=src, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, close_fds=True)
        self._out = self._proc.stdout
        try:
            fcntl.fcntl(self._out.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:  # above /proc/sys/fs/pipe-max-size for this user: the default pipe still works
            pass

    def readinto(self, buf) -> int:
        n = self._out.readinto(buf)
        if not n and len(buf):
            self._check()
        return n

    def read(self, n: int = -1) -> bytes:
        """Up to n bytes (all that is left for n < 0), fewer only at the end of the stream."""
        if n is None or n < 0:
            out = bytearray()
            while chunk := self.read(PIPE_BYTES):
                out += chunk
            return bytes(out)
        buf, got = bytearray(n), 0
        with memoryview(buf) as view:
            while got < n and (m := self.readinto(view[got:])):
                got += m
            return view[:got].tobytes()  # the one copy: a pipe gives a part in pieces

    def _check(self) -> None:
        err = self._proc.stderr.read().decode(errors="replace").strip()
        if self._proc.wait() != 0:
            raise OSError(f"encrypting the core failed: {err.splitlines()[-1] if err else 'killed'} "
                          f"(exit {self._proc.returncode})")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self._out.close()  # a child still at work gets EPIPE; a cancelled upload does not wait for it
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._proc.stderr.close()

    def __enter__(self) -> "EncryptingReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def encrypt_bytes(data: bytes, recipients: list) -> bytes:
    """A small object (the mini core, the sealed fields) as one age file to every recipient."""
    import pyrage

    return pyrage.encrypt(data, recipients)


def decrypt_file(src: Path, out: BinaryIO, identities: list, *, what: str) -> None:
    """Writes the plaintext of the age file src to out; IdentityError when no identity opens it."""
    with open(src, "rb") as f:
        _decrypt(f, out, identities, what)


def decrypt_bytes(data: bytes, identities: list, *, what: str) -> bytes:
    """The plaintext of a small age file (a mini core); IdentityError when no identity opens it."""
    out = io.BytesIO()
    _decrypt(io.BytesIO(data), out, identities, what)
    return out.getvalue()


def _decrypt(src: BinaryIO, out: BinaryIO, identities: list, what: str) -> None:
    import pyrage

    try:
        pyrage.decrypt_io(src, out, identities)
    except pyrage.DecryptError as e:
        raise IdentityError(f"{what}: cannot decrypt with the identities given ({e}); it was encrypted to "
                            "other recipients ([upload] recipients when it went up)") from None


def seal(sidecar: dict, recipients: list) -> dict:
    """The sidecar with SENSITIVE fields moved into one age blob, `sealed: {fields, age}` (base64)."""
    out = json.loads(json.dumps(sidecar, default=str))  # a deep copy the caller's dict does not share
    taken = {}
    for path in SENSITIVE:
        parent = out
        for part in path[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and path[-1] in parent:
            taken[".".join(path)] = parent.pop(path[-1])
    blob = encrypt_bytes(json.dumps(taken, sort_keys=True).encode(), recipients)
    out["sealed"] = {"fields": sorted(taken), "age": base64.b64encode(blob).decode()}
    return out


def unseal(sidecar: dict, identities: list) -> dict:
    """The sidecar with its sealed fields back in place (a sidecar without any is returned as is)."""
    import pyrage

    sealed = sidecar.get("sealed")
    if not sealed:
        return sidecar
    try:
        taken = json.loads(pyrage.decrypt(base64.b64decode(sealed["age"]), identities))
    except pyrage.DecryptError as e:
        raise IdentityError(f"the sealed fields of {sidecar.get('id')}: cannot decrypt with the identities "
                            f"given ({e})") from None
    out = {k: v for k, v in sidecar.items() if k != "sealed"}
    for dotted, value in taken.items():
        parent = out
        *head, last = dotted.split(".")
        for part in head:
            parent = parent.setdefault(part, {})
        parent[last] = value
    return out


def _encrypt_stdin(texts: list[str]) -> int:
    """EncryptingReader's child: stdin (the stored core) to stdout, age-encrypted to the public keys given.
    Through pyrage's own file I/O (encrypt_file): encrypt_io reads and writes through Python file objects."""
    import pyrage

    from corehandler import idlecpus

    idlecpus.not_idle()
    pyrage.encrypt_file("/dev/stdin", "/dev/stdout", recipients(texts))
    return 0


if __name__ == "__main__":
    raise SystemExit(_encrypt_stdin(sys.argv[1:]))
