"""age encryption of what leaves the host (corehandler/fleet/seal.py): streams, sealed sidecar fields,
identity files, the [upload] recipients setting."""

from __future__ import annotations

import hashlib
import io
import json
import os

import pytest
from pyrage import x25519

from corehandler.config import UploadConfig
from corehandler.errors import EXIT_PERMISSION
from corehandler.fleet import payload, seal


def keys(n: int = 1) -> list:
    return [x25519.Identity.generate() for _ in range(n)]


@pytest.mark.parametrize("size", [0, 1, 65536, 65537, (3 << 20) + 17])
def test_the_encrypting_stream_decrypts_to_the_file_and_digests_what_it_gave(tmp_path, size):
    ident, other = keys(2)
    src = tmp_path / "core.zst"
    src.write_bytes(os.urandom(size))
    with seal.EncryptingReader(src, [ident.to_public(), other.to_public()]) as enc:
        stream = payload.DigestingReader(enc, 5 << 20)
        parts = []
        while chunk := stream.read(1 << 20):
            parts.append(chunk)
    blob = b"".join(parts)
    assert len(blob) <= seal.encrypted_size_bound(size)
    d = stream.digester.result()
    assert d.size == len(blob) and d.sha256 == hashlib.sha256(blob).hexdigest()
    for key in (ident, other):
        (tmp_path / "obj.age").write_bytes(blob)
        out = io.BytesIO()
        seal.decrypt_file(tmp_path / "obj.age", out, [key], what="obj")
        assert out.getvalue() == src.read_bytes()


def test_a_source_that_fails_mid_stream_fails_the_read_not_a_short_object(tmp_path):
    src = tmp_path / "core"
    src.write_bytes(os.urandom(1 << 20))
    enc = seal.EncryptingReader(src, [keys()[0].to_public()])
    enc._src.close()  # the store's file becomes unreadable under the encryption
    with pytest.raises(OSError, match="encrypting the core failed"):
        while enc.read(1 << 16):
            pass
    enc.close()


def test_closing_early_stops_the_encryption(tmp_path):
    src = tmp_path / "core"
    src.write_bytes(os.urandom(8 << 20))
    enc = seal.EncryptingReader(src, [keys()[0].to_public()])
    enc.read(1000)
    enc.close()  # a cancelled upload: the writer must not block forever on a full pipe
    assert not enc._thread.is_alive()


def test_the_wrong_identity_is_a_permission_error(tmp_path):
    mine, theirs = keys(2)
    src = tmp_path / "core"
    src.write_bytes(b"x" * 1000)
    with seal.EncryptingReader(src, [theirs.to_public()]) as enc:
        (tmp_path / "obj").write_bytes(enc.read())
    with pytest.raises(seal.IdentityError, match="cannot decrypt") as err:
        seal.decrypt_file(tmp_path / "obj", io.BytesIO(), [mine], what="obj")
    assert err.value.exit_code == EXIT_PERMISSION


def sidecar() -> dict:
    return {"schema": 2, "id": "1-ab-1", "host": "alpha", "signature": "crasher:11",
            "index": {"exe": "/usr/bin/crasher", "cmdline": ["crasher", "--password=x"], "signal": 11},
            "record": {"proc": {"exe": "/usr/bin/crasher", "cmdline": ["crasher", "--password=x"],
                                "environ": ["TOKEN=y"], "maps": "00400000-..."},
                       "container": {"id": "c1", "annotations": {"secret": "z"}}},
            "analysis": {"signature": "crasher:11"}}


def test_sealing_moves_the_sensitive_fields_into_one_blob_and_back():
    ident = keys()[0]
    sc = sidecar()
    sealed = seal.seal(sc, [ident.to_public()])
    text = json.dumps(sealed)
    assert "password" not in text and "TOKEN" not in text and "00400000" not in text and "secret" not in text
    assert sealed["index"]["exe"] == "/usr/bin/crasher" and sealed["record"]["container"]["id"] == "c1"
    assert sealed["sealed"]["fields"] == sorted(".".join(p) for p in seal.SENSITIVE)
    assert sc == sidecar()  # the caller's dict is left alone
    assert seal.unseal(sealed, [ident]) == sc
    with pytest.raises(seal.IdentityError):
        seal.unseal(sealed, keys())


def test_sealing_a_sidecar_without_those_fields_seals_nothing():
    ident = keys()[0]
    sealed = seal.seal({"id": "1-ab-1", "record": {"proc": {"exe": "/bin/x"}}}, [ident.to_public()])
    assert sealed["sealed"]["fields"] == []
    assert seal.unseal(sealed, [ident]) == {"id": "1-ab-1", "record": {"proc": {"exe": "/bin/x"}}}


def test_identity_files_age_keygen_style(tmp_path):
    a, b = keys(2)
    path = tmp_path / "keys.txt"
    path.write_text(f"# created: now\n# public key: {a.to_public()}\n{a}\n\n{b}\n")
    assert [str(i) for i in seal.load_identities(path)] == [str(a), str(b)]
    for text, words in (("", "holds no age identity"), ("# only a comment\n", "holds no age identity"),
                        (f"{a}\nAGE-SECRET-KEY-1BROKEN\n", "line 2")):
        path.write_text(text)
        with pytest.raises(seal.IdentityError, match=words):
            seal.load_identities(path)
    with pytest.raises(seal.IdentityError, match="No such file"):
        seal.load_identities(tmp_path / "absent")


def test_recipients_are_checked_when_the_config_is_read():
    pub = str(keys()[0].to_public())
    assert UploadConfig.model_validate({"recipients": [pub, f" {pub} "]}).recipients == [pub, pub]
    assert UploadConfig().recipients == []
    for bad in (["age1notakey"], ["AGE-SECRET-KEY-1..."], "age1...", [1]):
        with pytest.raises(ValueError):
            UploadConfig.model_validate({"recipients": bad})


def test_a_private_key_in_recipients_is_refused_without_echoing_it():
    ident = keys()[0]
    with pytest.raises(ValueError, match="holds a private key") as err:
        UploadConfig.model_validate({"recipients": [str(ident)]})
    assert str(ident) not in str(err.value)
