"""podman for the containers tier (tests/containers/): every podman the tests run reads the tier's own
containers.conf (CONTAINERS_CONF), never the host's; the node agent's image is built once per session by
packaging/kubernetes/image/build.sh under a name of the tests' own, and removed with every container the tests
made."""

from __future__ import annotations

import json
import os
import resource
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "tests" / "containers" / "containers.conf"
BUILD = ROOT / "packaging" / "kubernetes" / "image" / "build.sh"


def env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONF)}


def _core_unlimited() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def podman(*args: str, check: bool = True, timeout: float = 300, dumps: bool = False) -> subprocess.CompletedProcess:
    """dumps: podman (and `run --ulimit host`'s container) with RLIMIT_CORE unlimited. A container's own ulimit
    (`--ulimit core=-1`) makes podman set nofile and nproc too, above these VMs' hard limits: runc fails."""
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=env(),
                            preexec_fn=_core_unlimited if dumps else None)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


# A .deb built already (packaging/deb/build.sh) to make the image from, instead of building one.
DEB_ENV = "COREHANDLER_IMAGE_DEB"


def build_image(out: Path, name: str) -> tuple[Path, str]:
    """Builds and loads the image as name; returns the OCI archive and the size line build.sh printed."""
    deb = ["--deb", os.environ[DEB_ENV]] if os.environ.get(DEB_ENV) else []
    done = subprocess.run([str(BUILD), "--out", str(out), "--name", name, *deb], capture_output=True, text=True,
                          timeout=3600, env=env())
    if done.returncode != 0:
        raise AssertionError(f"build.sh exited {done.returncode}\n{done.stdout}\n{done.stderr}")
    (archive,) = out.glob("corehandler-*.oci.tar")
    return archive, done.stdout.strip()


def inspect(container: str) -> dict:
    return json.loads(podman("container", "inspect", container).stdout)[0]


def remove(*containers: str) -> None:
    for name in containers:
        podman("rm", "--force", "--time", "0", name, check=False, timeout=120)


def remove_image(name: str) -> None:
    podman("rmi", "--force", name, check=False, timeout=300)
