"""The containers tier: the node agent's image, built once per session (build.sh through mmdebstrap; from the
.deb COREHANDLER_IMAGE_DEB names, if set, instead of building one) and removed at its end."""

from __future__ import annotations

import os

import pytest

from support import podman


@pytest.fixture(scope="session")
def agent_image(tmp_path_factory):
    """(name, OCI archive, build.sh's size line) of the image built from this tree."""
    name = f"localhost/corehandler-test:{os.getpid()}"
    try:
        archive, line = podman.build_image(tmp_path_factory.mktemp("image"), name)
        yield name, archive, line
    finally:
        podman.remove_image(name)
