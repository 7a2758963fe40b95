"""podman for the containers tier (tests/containers/): every podman the tests run reads the tier's own
containers.conf (CONTAINERS_CONF), never the host's; the node agent's image is built once per session by
packaging/kubernetes/image/build.sh under a name of the tests' own, and removed with every container the tests
made."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "tests" / "containers" / "containers.conf"
BUILD = ROOT / "packaging" / "kubernetes" / "image" / "build.sh"


def env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONF)}


def podman(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=env())
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def build_image(out: Path, name: str) -> tuple[Path, str]:
    """Builds and loads the image as name; returns the OCI archive and the size line build.sh printed."""
    done = subprocess.run([str(BUILD), "--out", str(out), "--name", name], capture_output=True, text=True,
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
