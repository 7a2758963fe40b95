"""age encryption of what leaves the host (corehandler/fleet/seal.py): streams, sealed sidecar fields,
identity files, the [upload] recipients setting."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pyrage import x25519

from corehandler import spool
from corehandler.config import UploadConfig
from corehandler.fleet import payload, seal


def keys(n: int = 1) -> list:
    return [x25519.Identity.generate() for _ in range(n)]


def sidecar() -> dict:
    return {"schema": 2, "id": "1-ab-1", "host": "alpha", "signature": "crasher:11",
            "index": {"exe": "/usr/bin/crasher", "cmdline": ["crasher", "--password=x"], "signal": 11},
            "record": {"proc": {"exe": "/usr/bin/crasher", "cmdline": ["crasher", "--password=x"],
                                "environ": ["TOKEN=y"], "maps": "00400000-...",
                                "container": {"id": "c1", "annotations": {"secret": "z"}}}},
            "analysis": {"signature": "crasher:11"}}


def test_sealing_moves_the_sensitive_fields_into_one_blob_and_back():
    ident = keys()[0]
    sc = sidecar()
    sealed = seal.seal(sc, [ident.to_public()])
    text = json.dumps(sealed)
    assert "password" not in text and "TOKEN" not in text and "00400000" not in text and "secret" not in text
    assert sealed["index"]["exe"] == "/usr/bin/crasher" and sealed["record"]["proc"]["container"]["id"] == "c1"
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
    with pytest.raises(ValueError, match=r"an age private key \(AGE-SECRET-KEY-1…\) is not a recipient") as err:
        UploadConfig.model_validate({"recipients": [str(ident)]})
    assert str(ident) not in str(err.value)


def documented_sealed() -> list[str]:
    """The sidecar fields docs/design.md says are sealed, as it names them."""
    design = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    said = re.search(r"The sidecar's (.*?) \(`seal\.SENSITIVE`\) move into", design, re.S)
    assert said, "docs/design.md no longer lists the sealed fields where this test reads them"
    return re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", said.group(1))


def test_every_field_the_docs_call_sealed_is_sealed():
    documented = documented_sealed()
    assert "record.proc.container.annotations" in documented and len(documented) >= 5
    # Each names a field where csplice's record has it (spool.py's shape of the record)...
    for dotted in documented:
        head, *rest = dotted.split(".")
        if head == "record":
            assert rest[0] in spool._SHAPE if len(rest) == 1 else \
                (rest[0] == "proc" and rest[1] in spool._PROC_SHAPE), dotted
    # ...and a sidecar holding each, made as the uploader makes it, has none of them in clear once sealed.
    doc = {"id": "1-ab-1", "index": {"exe": "/bin/x"}, "record": {"proc": {"exe": "/bin/x"}}}
    for i, dotted in enumerate(documented):
        parent = doc
        *head, last = dotted.split(".")
        for part in head:
            parent = parent.setdefault(part, {})
        parent[last] = f"marker-{i}"
    doc["record"] = payload.shareable_record(doc["record"], environ=True, maps=True)
    ident = keys()[0]
    sealed = seal.seal(doc, [ident.to_public()])
    text = json.dumps({k: v for k, v in sealed.items() if k != "sealed"})
    assert "marker" not in text, text
    assert sealed["sealed"]["fields"] == sorted(documented)
    assert seal.unseal(sealed, [ident]) == doc
