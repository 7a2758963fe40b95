"""age encryption of a stored core as it goes up (corehandler/fleet/seal.py's EncryptingReader): a child
process encrypts, the upload reads and digests; what it gives decrypts to the file, and a child that fails or
is cancelled never yields a short object."""

from __future__ import annotations

import io
import os
import threading

import pytest
from pyrage import x25519

from corehandler.errors import EXIT_PERMISSION
from corehandler.fleet import seal, transfer
from support.waiting import wait_for


def keys(n: int = 1) -> list:
    return [x25519.Identity.generate() for _ in range(n)]


@pytest.mark.parametrize("size", [0, 1, 65536, 65537, (3 << 20) + 17])
def test_the_encrypting_stream_decrypts_to_the_file_and_digests_what_it_gave(tmp_path, size):
    ident, other = keys(2)
    src = tmp_path / "core.zst"
    src.write_bytes(os.urandom(size))
    with seal.EncryptingReader(src, [ident.to_public(), other.to_public()]) as enc:
        parts = []
        while part := transfer.read_part(enc, 1 << 20):  # as the upload reads it
            parts.append(bytes(part))
    blob = b"".join(parts)
    assert len(blob) <= seal.encrypted_size_bound(size)
    assert all(len(p) == 1 << 20 for p in parts[:-1])  # a pipe's short reads never end a part early
    for key in (ident, other):
        (tmp_path / "obj.age").write_bytes(blob)
        out = io.BytesIO()
        seal.decrypt_file(tmp_path / "obj.age", out, [key], what="obj")
        assert out.getvalue() == src.read_bytes()


def test_an_encryption_that_dies_mid_stream_fails_the_read_not_a_short_object(tmp_path):
    src = tmp_path / "core"
    src.write_bytes(os.urandom(8 << 20))
    enc = seal.EncryptingReader(src, [keys()[0].to_public()])
    assert len(enc.read(1 << 16)) == 1 << 16
    enc._proc.kill()  # the OOM killer, a signal: the stream stops short
    with pytest.raises(OSError, match="encrypting the core failed"):
        while enc.read(1 << 16):
            pass
    enc.close()


def test_a_recipient_the_child_cannot_use_fails_the_read(tmp_path):
    src = tmp_path / "core"
    src.write_bytes(b"x" * 1000)
    enc = seal.EncryptingReader(src, ["age1notakey"])
    with pytest.raises(OSError, match="encrypting the core failed: .*not an age X25519 public key"):
        enc.read(1 << 16)
    enc.close()


def test_the_encryption_runs_beside_the_daemons_threads_not_under_its_gil(tmp_path):
    """pyrage holds the GIL while it encrypts: in a thread of the daemon it starved the upload's threads."""
    src = tmp_path / "core"
    src.write_bytes(os.urandom(64 << 20))
    with seal.EncryptingReader(src, [keys()[0].to_public()]) as enc:
        assert enc._proc.pid != os.getpid() and enc._proc.poll() is None
        while enc.read(1 << 20):
            pass
        assert enc._proc.returncode == 0


def test_closing_early_stops_the_encryption(tmp_path):
    src = tmp_path / "core"
    src.write_bytes(os.urandom(8 << 20))
    enc = seal.EncryptingReader(src, [keys()[0].to_public()])
    enc.read(1000)
    enc.close()  # a cancelled upload: the child must not block forever on a full pipe
    assert enc._proc.returncode is not None


def test_the_wrong_identity_is_a_permission_error(tmp_path):
    mine, theirs = keys(2)
    src = tmp_path / "core"
    src.write_bytes(b"x" * 1000)
    with seal.EncryptingReader(src, [theirs.to_public()]) as enc:
        (tmp_path / "obj").write_bytes(enc.read())
    with pytest.raises(seal.IdentityError, match="cannot decrypt") as err:
        seal.decrypt_file(tmp_path / "obj", io.BytesIO(), [mine], what="obj")
    assert err.value.exit_code == EXIT_PERMISSION


@pytest.mark.root
def test_a_sealer_started_by_a_thread_stepping_aside_for_a_capture_does_not_stay_sched_idle(tmp_path):
    """idlecpus.StepAside makes every thread of the daemon SCHED_IDLE while a capture runs; the sealer forked
    then would keep it for its life, and crawl through the upload on a busy host."""
    src = tmp_path / "core.zst"
    src.write_bytes(os.urandom(8 << 20))  # more than the pipe holds: the child waits for our reads, alive
    got = {}

    def idle_thread():
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        got["enc"] = seal.EncryptingReader(src, [keys()[0].to_public()])

    t = threading.Thread(target=idle_thread)
    t.start()
    t.join(30)
    with got["enc"] as enc:
        pid = enc._proc.pid
        wait_for(lambda: os.sched_getscheduler(pid) == os.SCHED_OTHER, 30, "the sealer left SCHED_IDLE")
        while transfer.read_part(enc, 1 << 20):
            pass
