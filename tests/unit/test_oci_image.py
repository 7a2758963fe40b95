"""packaging/kubernetes/image/oci.py: the same root filesystem and SOURCE_DATE_EPOCH give the same archive, byte
for byte, laid out as the OCI image spec says and named for podman and containerd."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import tarfile
from pathlib import Path

OCI = Path(__file__).resolve().parents[2] / "packaging" / "kubernetes" / "image" / "oci.py"
NAME = "localhost/corehandler:0.0.0-test"


def _oci():
    spec = importlib.util.spec_from_file_location("oci_image", OCI)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rootfs(path: Path) -> Path:
    with tarfile.open(path, "w") as tar:
        data = b"#!/bin/sh\necho corehandler\n"
        info = tarfile.TarInfo("./usr/bin/corehandler")
        info.size, info.mode, info.mtime = len(data), 0o755, 1
        tar.addfile(info, io.BytesIO(data))
    return path


def _build(tmp_path: Path, out: str, epoch: int) -> tuple[bytes, dict]:
    done = _oci().build(str(_rootfs(tmp_path / "rootfs.tar")), str(tmp_path / out), NAME, ["/usr/bin/corehandler"],
                        [], epoch, {"org.opencontainers.image.version": "0.0.0-test"})
    return (tmp_path / out).read_bytes(), done


def test_the_archive_is_the_same_for_the_same_input_and_epoch(tmp_path):
    first, done = _build(tmp_path, "a.oci.tar", 1_700_000_000)
    second, _ = _build(tmp_path, "b.oci.tar", 1_700_000_000)
    third, _ = _build(tmp_path, "c.oci.tar", 1_700_000_001)
    assert first == second and first != third
    assert done["archive_bytes"] == len(first) and done["rootfs_bytes"] == (tmp_path / "rootfs.tar").stat().st_size


def test_the_layout_names_the_image_and_every_digest_matches(tmp_path):
    data, done = _build(tmp_path, "x.oci.tar", 1_700_000_000)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        assert {(m.uid, m.gid, m.mtime) for m in tar.getmembers()} == {(0, 0, 1_700_000_000)}
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, blob in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(blob).hexdigest() == name.rsplit("/", 1)[1]
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"] == {"org.opencontainers.image.ref.name": NAME, "io.containerd.image.name": NAME}
    assert entry["digest"] == done["manifest"]
    manifest = json.loads(files["blobs/sha256/" + entry["digest"].split(":")[1]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["config"]["Entrypoint"] == ["/usr/bin/corehandler"] and config["os"] == "linux"
    assert config["created"] == "2023-11-14T22:13:20Z"
    (layer,) = manifest["layers"]
    unpacked = tarfile.open(fileobj=io.BytesIO(files["blobs/sha256/" + layer["digest"].split(":")[1]]), mode="r:gz")
    assert unpacked.getnames() == ["./usr/bin/corehandler"]
    rootfs = (tmp_path / "rootfs.tar").read_bytes()
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(rootfs).hexdigest()]
