"""Wraps a root filesystem tarball into an OCI image archive, byte for byte the same for the same input and
SOURCE_DATE_EPOCH (no clock, no host name, no user id of the builder in it): `podman load`, `ctr -n k8s.io
images import` and `kind load image-archive` take it.

    python3 oci.py ROOTFS.tar OUT.oci.tar --name localhost/corehandler:VERSION --entrypoint /usr/bin/corehandler

One layer (the rootfs, gzip without a name or time), one config, one manifest; the index names the image for
podman (org.opencontainers.image.ref.name) and containerd (io.containerd.image.name). Prints the layer's and the
archive's sizes as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import tarfile
import tempfile

# Go's names for the machine (the config's "architecture"), which runtimes compare with their own.
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x",
                 "riscv64": "riscv64"}
CHUNK = 1 << 20


def _digest_and_gzip(rootfs: str, out: str, epoch: int) -> tuple[str, str, int]:
    """The uncompressed layer's digest (the config's diff_id), the compressed blob's digest and size."""
    raw, packed = hashlib.sha256(), hashlib.sha256()

    class Hashing(io.RawIOBase):
        def __init__(self, f):
            self.f, self.size = f, 0

        def writable(self):
            return True

        def write(self, b):
            packed.update(b)
            self.size += len(b)
            return self.f.write(b)

    with open(rootfs, "rb") as src, open(out, "wb") as f:
        sink = Hashing(f)
        with gzip.GzipFile(filename="", mode="wb", fileobj=sink, mtime=epoch, compresslevel=6) as z:
            while chunk := src.read(CHUNK):
                raw.update(chunk)
                z.write(chunk)
    return "sha256:" + raw.hexdigest(), "sha256:" + packed.hexdigest(), sink.size


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build(rootfs: str, out: str, name: str, entrypoint: list[str], cmd: list[str], epoch: int,
          labels: dict[str, str]) -> dict:
    created = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    work = tempfile.mkdtemp(prefix="oci-", dir=os.path.dirname(os.path.abspath(out)))
    try:
        layer_path = os.path.join(work, "layer")
        diff_id, layer_digest, layer_size = _digest_and_gzip(rootfs, layer_path, epoch)
        config = {
            "created": created, "architecture": ARCHITECTURES.get(platform.machine(), platform.machine()),
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "Cmd": cmd, "Labels": labels, "WorkingDir": "/",
                       "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": created, "created_by": "packaging/kubernetes/image/build.sh"}],
        }
        config_digest, config_bytes = _blob(_canonical(config))
        manifest = {
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                       "size": len(config_bytes)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_digest,
                        "size": layer_size}],
            "annotations": {"org.opencontainers.image.created": created, **labels},
        }
        manifest_digest, manifest_bytes = _blob(_canonical(manifest))
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
            "size": len(manifest_bytes),
            "annotations": {"org.opencontainers.image.ref.name": name, "io.containerd.image.name": name}}]}
        tmp = out + ".tmp"
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            def add(path: str, data: bytes | None = None, file: str | None = None) -> None:
                info = tarfile.TarInfo(path)
                info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
                if data is None and file is None:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                    return
                info.mode = 0o644
                info.size = len(data) if data is not None else os.path.getsize(file)
                if data is not None:
                    tar.addfile(info, io.BytesIO(data))
                else:
                    with open(file, "rb") as f:
                        tar.addfile(info, f)
            add("blobs")
            add("blobs/sha256")
            for digest, data, file in sorted([(config_digest, config_bytes, None), (layer_digest, None, layer_path),
                                              (manifest_digest, manifest_bytes, None)]):
                add("blobs/sha256/" + digest.split(":", 1)[1], data, file)
            add("index.json", _canonical(index))
            add("oci-layout", _canonical({"imageLayoutVersion": "1.0.0"}))
        os.replace(tmp, out)
    finally:
        shutil.rmtree(work)
    return {"name": name, "manifest": manifest_digest, "rootfs_bytes": os.path.getsize(rootfs),
            "layer_bytes": layer_size, "archive_bytes": os.path.getsize(out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rootfs")
    parser.add_argument("out")
    parser.add_argument("--name", required=True)
    parser.add_argument("--entrypoint", required=True)
    parser.add_argument("--cmd", nargs="*", default=[])
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    labels = dict(label.split("=", 1) for label in args.label)
    print(json.dumps(build(args.rootfs, args.out, args.name, [args.entrypoint], args.cmd, epoch, labels)))


if __name__ == "__main__":
    main()
