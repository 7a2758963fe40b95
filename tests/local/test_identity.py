"""Who crashed (corehandler/analysis/identity.py), from /proc/PID/cgroup and status texts as each runtime leaves
them."""

import json

import pytest

from corehandler.analysis import identity

ID = "3f2a9c0e1b7d4c5a8e6f0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f"
UID = "7c4d2a1e-93b5-4f0c-8d6e-1a2b3c4d5e6f"


@pytest.mark.parametrize("cgroup, expected", [
    # plain systemd units, v2
    ("0::/system.slice/nginx.service\n", dict(runtime="systemd", unit="nginx.service", slice="system.slice")),
    ("0::/system.slice/system-getty.slice/getty@tty1.service\n",
     dict(runtime="systemd", unit="getty@tty1.service", slice="system-getty.slice")),
    ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-firefox-1234.scope\n",
     dict(runtime="systemd", unit="user@1000.service", user_unit="app-gnome-firefox-1234.scope",
          slice="user-1000.slice")),
    ("0::/user.slice/user-1000.slice/session-3.scope\n", dict(unit="session-3.scope", slice="user-1000.slice")),
    # hybrid (this machine's kind): the unified path is "/", the name=systemd hierarchy says more
    ("12:memory:/system.slice/cron.service\n1:name=systemd:/system.slice/cron.service\n0::/\n",
     dict(runtime="systemd", unit="cron.service", slice="system.slice", cgroup="/system.slice/cron.service")),
    # pure v1
    ("4:cpu,cpuacct:/system.slice/sshd.service\n1:name=systemd:/system.slice/sshd.service\n",
     dict(unit="sshd.service")),
    # containerd (CRI) with the systemd driver, and with cgroupfs
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
     f"cri-containerd-{ID}.scope\n",
     dict(runtime="containerd", container_id=ID, pod_uid=UID, slice="kubepods-burstable-pod"
          f"{UID.replace('-', '_')}.slice", unit=f"cri-containerd-{ID}.scope")),
    (f"0::/kubepods/burstable/pod{UID}/{ID}\n", dict(runtime="containerd", container_id=ID, pod_uid=UID)),
    (f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{ID}.scope\n",
     dict(runtime="containerd", pod_uid=UID)),
    # CRI-O
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
     f"crio-{ID}.scope\n", dict(runtime="cri-o", container_id=ID, pod_uid=UID)),
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
     f"crio-{ID}.scope/container\n", dict(runtime="cri-o", container_id=ID)),
    # Docker: systemd driver, cgroupfs driver (v1 and v2)
    (f"0::/system.slice/docker-{ID}.scope\n", dict(runtime="docker", container_id=ID, slice="system.slice")),
    (f"12:pids:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/\n", dict(runtime="docker", container_id=ID)),
    (f"0::/docker/{ID}\n", dict(runtime="docker", container_id=ID)),
    # Podman: rootful, rootless, cgroupfs
    (f"0::/machine.slice/libpod-{ID}.scope/container\n", dict(runtime="podman", container_id=ID,
                                                                 slice="machine.slice")),
    # rootless: below a user manager every name is the user's, so no container is attributed from it
    (f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container\n",
     dict(runtime="systemd", container_id=None, user_unit=f"libpod-{ID}.scope", slice="user-1000.slice")),
    (f"0::/libpod_parent/libpod-{ID}\n", dict(runtime="podman", container_id=ID)),
    # systemd-nspawn: the template unit, and a registered machine scope
    ("0::/machine.slice/systemd-nspawn@debian.service/payload/system.slice/cron.service\n",
     dict(runtime="systemd-nspawn", machine="debian")),
    ("0::/machine.slice/machine-my\\x2dbox.scope/payload\n", dict(runtime="systemd-nspawn", machine="my-box")),
    # nothing to say
    ("0::/\n", dict(runtime=None, unit=None, container_id=None)),
    ("", dict(runtime=None, cgroup=None)),
    ("garbage without colons\n", dict(runtime=None)),
])
def test_cgroup_formats(cgroup, expected):
    got = identity.identify({"proc": {"cgroup": cgroup}})
    assert {k: got[k] for k in expected} == expected


@pytest.mark.parametrize("status, pids", [
    ("Name:\tapp\nNSpid:\t4242\t1\n", [4242, 1]),
    ("Name:\tapp\nNSpid:\t4242\n", [4242]),
    ("Name:\tapp\n", None),
    ("NSpid:\tx\n", None),
])
def test_nspid(status, pids):
    got = identity.identify({"proc": {"status": status}})
    assert got["nspid"] == pids and got["pid_in_namespace"] == (pids[-1] if pids else None)


def test_namespaces_from_readlinks():
    got = identity.identify({"proc": {"ns": {"pid": "pid:[4026532300]", "mnt": "mnt:[4026531841]",
                                             "bad": "nonsense", "net": None}}})
    assert got["namespaces"] == {"pid": 4026532300, "mnt": 4026531841}


CRI_CONFIG = {"ociVersion": "1.1.0", "process": {"args": ["/app"]}, "root": {"path": "rootfs"},
              "annotations": {"io.kubernetes.cri.container-type": "container",
                              "io.kubernetes.cri.container-name": "web",
                              "io.kubernetes.cri.image-name": "docker.io/library/nginx:1.25",
                              "io.kubernetes.cri.sandbox-name": "web-6d4cf56db6-x7k2p",
                              "io.kubernetes.cri.sandbox-namespace": "shop",
                              "io.kubernetes.cri.sandbox-uid": UID},
              "linux": {"seccomp": {"syscalls": [{"names": ["read"] * 2000}]}}}
CRIO_CONFIG = {"ociVersion": "1.0.2", "annotations": {"io.kubernetes.pod.name": "db-0",
                                                      "io.kubernetes.pod.namespace": "data",
                                                      "io.kubernetes.container.name": "postgres",
                                                      "io.kubernetes.cri-o.ImageName": "postgres:16",
                                                      "io.kubernetes.pod.uid": UID}}


def container(config: dict, runtime: str = "containerd") -> dict:
    """proc.container as csplice writes it for a bundle with this config.json (only the known annotations)."""
    names = {n for ns in identity.ANNOTATIONS.values() for n in ns}
    return {"id": ID, "runtime": runtime,
            "annotations": {k: v for k, v in config["annotations"].items() if k in names}}


@pytest.mark.parametrize("config, expected", [
    (CRI_CONFIG, dict(pod_name="web-6d4cf56db6-x7k2p", pod_namespace="shop", container_name="web",
                      image="docker.io/library/nginx:1.25", pod_uid=UID, container_id=ID)),
    (CRIO_CONFIG, dict(pod_name="db-0", pod_namespace="data", container_name="postgres", image="postgres:16")),
])
def test_oci_annotations(config, expected):
    got = identity.identify({"proc": {"container": container(config)}})
    assert {k: got[k] for k in expected} == expected


def test_a_cgroup_alone_names_no_pod():
    """Below user@UID.service every name is the user's: a cgroup named after a victim's pod and container
    attributes nothing to that pod, and a raw config.json of an older record is not read at all."""
    cgroup = (f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/kubepods-pod{UID.replace('-', '_')}"
              f".slice/cri-containerd-{ID}.scope\n")
    got = identity.identify({"proc": {"cgroup": cgroup, "oci_config": json.dumps(CRI_CONFIG)}})
    assert (got["pod_uid"], got["pod_name"], got["container_name"], got["container_id"], got["runtime"]) == \
        (None, None, None, None, "systemd")


def test_missing_and_wrong_types_never_raise():
    for record in ({}, {"proc": None},
                   {"proc": {"cgroup": 5, "status": [], "ns": "x", "container": {"id": 5, "annotations": [1]}}},
                   {"proc": {"container": {"id": ID, "annotations": {"io.kubernetes.pod.name": 7}}}}):
        got = identity.identify(record)
        assert got["runtime"] is None and got["namespaces"] == {}
