"""Encrypted uploads (`[upload] recipients`, age X25519) through the real S3 server and back, read by our CLI
and by Debian's `age` tool: the core and the sensitive sidecar fields leave the host encrypted, the fleet
view still groups without a key, a key rotation keeps old dumps readable with the old key."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from pyrage import x25519

from corehandler.errors import EXIT_PERMISSION
from corehandler.store.index import Store
from support.fleethost import Host, dump_keys, sha_file

pytestmark = pytest.mark.s3

SECRET_ARG = "--token=hunter2-do-not-leak"


def keypair(tmp_path: Path, name: str) -> tuple[str, Path]:
    """(public key, identity file) made the way an admin would: an age-keygen style file."""
    ident = x25519.Identity.generate()
    path = tmp_path / f"{name}.key"
    path.write_text(f"# created: test\n# public key: {ident.to_public()}\n{ident}\n")
    path.chmod(0o600)
    return str(ident.to_public()), path


def proc_with_cmdline(root: Path, pid: int) -> Path:
    """A proc root where the crashed process's command line holds a secret."""
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cmdline").write_bytes(b"/usr/bin/secretd\0" + SECRET_ARG.encode() + b"\0")
    return root


def stored_file(host: Host, dump_id: str) -> Path:
    with Store(host.state, readonly=True) as store:
        return store.file_path(store.get(dump_id))


def test_an_encrypted_dump_round_trips_through_s3_our_cli_and_the_age_tool(tmp_path, s3, feeder, csplice, capsys):
    bucket = s3.new_bucket()
    pub1, key1 = keypair(tmp_path, "ops")
    pub2, key2 = keypair(tmp_path, "break-glass")
    host = Host(tmp_path, s3, bucket, recipients=[pub1, pub2])
    record = host.crash(feeder, csplice, size=3 << 20, pid=4242,
                        proc_root=proc_with_cmdline(tmp_path / "proc", 4242))
    assert SECRET_ARG in (record["proc"]["cmdline"] or [])  # what the sealing has to hide
    host.upload_all()
    keys = dump_keys(s3, bucket, record["id"])
    (core_key,) = [k for k in keys if not k.endswith(".json")]
    (sidecar_key,) = [k for k in keys if k.endswith(".json")]
    assert core_key.endswith(".zst.age")

    # Whoever reads the bucket sees neither the core nor the command line.
    raw_sidecar = s3.client().get_object(Bucket=bucket, Key=sidecar_key)["Body"].read()
    assert b"hunter2" not in raw_sidecar
    sidecar = json.loads(raw_sidecar)
    assert "cmdline" not in sidecar["record"]["proc"] and "cmdline" not in sidecar["index"]
    assert "record.proc.cmdline" in sidecar["sealed"]["fields"]
    assert sorted(sidecar["sealed"]["recipients"]) == sorted(sidecar["core"]["recipients"]) == sorted([pub1, pub2])
    assert sidecar["index"]["comm"] == "feeder" and sidecar["signature"] and sidecar["core"]["encryption"] == "age"
    obj = tmp_path / "object.age"
    obj.write_bytes(s3.client().get_object(Bucket=bucket, Key=core_key)["Body"].read())
    assert obj.read_bytes().startswith(b"age-encryption.org/v1\n")

    # Debian's age opens it with either recipient's key, to the very bytes the store holds.
    for key in (key1, key2):
        plain = subprocess.run([shutil.which("age"), "-d", "-i", str(key), str(obj)], capture_output=True,
                               check=True).stdout
        assert plain == stored_file(host, record["id"]).read_bytes()

    # Grouping needs no key.
    code, out, _ = host.cli(capsys, "fleet", "list", "--days", "2", "--group", "--json")
    assert code == 0 and json.loads(out)[0]["count"] == 1

    out_file = tmp_path / "back.core"
    code, _, err = host.cli(capsys, "fleet", "get", record["id"], "--identity", str(key2), "-o", str(out_file))
    assert code == 0, err
    assert sha_file(out_file) == record["_sha256"]
    code, out, _ = host.cli(capsys, "fleet", "info", record["id"], "--identity", str(key1), "--json")
    assert code == 0 and SECRET_ARG in json.loads(out)["record"]["proc"]["cmdline"]
    code, out, _ = host.cli(capsys, "fleet", "info", record["id"])
    assert code == 0 and "Encrypted: age, to 2 recipient(s)" in out and "hunter2" not in out


def test_a_key_rotation_keeps_old_dumps_readable_with_the_old_key(tmp_path, s3, feeder, csplice, capsys):
    bucket = s3.new_bucket()
    old_pub, old_key = keypair(tmp_path, "old")
    new_pub, new_key = keypair(tmp_path, "new")
    host = Host(tmp_path, s3, bucket, recipients=[old_pub])
    first = host.crash(feeder, csplice, size=1 << 20, pid=1001)
    host.upload_all()
    host.upload["recipients"] = [new_pub]  # the rotation: the host's config names the new key only
    second = host.crash(feeder, csplice, size=1 << 20, pid=1002)
    host.upload_all(n=2)

    for record, key in ((first, old_key), (second, new_key)):
        out_file = tmp_path / f"{record['id']}.core"
        code, _, err = host.cli(capsys, "fleet", "get", record["id"], "--identity", str(key), "-o", str(out_file))
        assert code == 0, err
        assert sha_file(out_file) == record["_sha256"]

    # The wrong key, no key, a missing or broken identity file: one clear line, exit 4, nothing written.
    out_file = tmp_path / "nothing.core"
    garbage = tmp_path / "garbage.key"
    garbage.write_text("AGE-SECRET-KEY-NOPE\n")
    for extra, words in ((["--identity", str(old_key)], "cannot decrypt"),
                         ([], "--identity"),
                         (["--identity", str(tmp_path / "absent.key")], "absent.key"),
                         (["--identity", str(garbage)], "line 1")):
        code, out, err = host.cli(capsys, "fleet", "get", second["id"], *extra, "-o", str(out_file))
        assert code == EXIT_PERMISSION, err
        assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert not out_file.exists()
        assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no temp file left


def test_an_encrypted_core_over_one_part_streams_up_in_parts_and_verifies(tmp_path, s3, feeder, csplice, capsys):
    bucket = s3.new_bucket()
    pub, key = keypair(tmp_path, "ops")
    host = Host(tmp_path, s3, bucket, compression=False, part_size="5M", recipients=[pub])
    record = host.crash(feeder, csplice, size=12 << 20)
    host.upload_all(timeout=120)
    (core_key,) = [k for k in dump_keys(s3, bucket, record["id"]) if not k.endswith(".json")]
    assert core_key.endswith(".core.age")
    head = s3.client().head_object(Bucket=bucket, Key=core_key, ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"].endswith("-3")  # 5M + 5M + the rest and age's 16 bytes per 64 KiB
    out_file = tmp_path / "back.core"
    code, _, err = host.cli(capsys, "fleet", "get", record["id"], "--identity", str(key), "-o", str(out_file))
    assert code == 0, err
    assert sha_file(out_file) == record["_sha256"]
