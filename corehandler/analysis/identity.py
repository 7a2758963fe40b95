"""Who crashed: runtime, container, pod, systemd unit and slice, namespaces, from what csplice read while
/proc/PID existed (docs/analysis.md, "Identity"). Pure functions of the record; nothing here asks a runtime.

Inputs: proc.cgroup (/proc/PID/cgroup), proc.status (its NSpid line), proc.ns (namespace inodes, csplice's
readlinks of /proc/PID/ns/*) and proc.container (the container csplice vouched for: a runtime's own cgroup
form outside any user manager, that runtime's bundle, the bundle init's namespaces; with the annotations of
its config.json that name the pod and the container, and nothing else of that file).

The cgroup path alone is partly the process's to choose (a user names the cgroups delegated to them), so a pod
is named only from proc.container, and nothing below a user manager (user@UID.service) names a container or a
pod: rootless containers are identified by their user unit only.

cgroup v2 ("0::/path"), v1 and hybrid hosts (a "name=systemd" hierarchy beside the controllers) all work:
the unified path is used when it says more than "/", else the name=systemd one, else the first v1 path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Runtime names, as `list --container` and the journal fields spell them.
CONTAINERD, CRIO, DOCKER, PODMAN, NSPAWN, SYSTEMD = "containerd", "cri-o", "docker", "podman", "systemd-nspawn", \
    "systemd"

_ID = r"([0-9a-f]{64})"
# (runtime, pattern over one cgroup path component); the id is group 1.
_CONTAINER_COMPONENTS = (
    (CONTAINERD, re.compile(rf"^cri-containerd-{_ID}\.scope$")),
    (CRIO, re.compile(rf"^crio-{_ID}\.scope$")),
    (DOCKER, re.compile(rf"^docker-{_ID}\.scope$")),
    (PODMAN, re.compile(rf"^libpod-{_ID}\.scope$")),
    (PODMAN, re.compile(rf"^libpod-{_ID}$")),
)
# cgroupfs drivers name the container by its bare id under a runtime's directory.
_PARENTS = {"docker": DOCKER, "libpod_parent": PODMAN, "crio": CRIO, "containerd": CONTAINERD}
_BARE_ID = re.compile(rf"^{_ID}$")
_POD = re.compile(r"^(?:kubepods-(?:besteffort-|burstable-|guaranteed-)?)?pod([0-9a-f_-]{32,36})(?:\.slice)?$")
_NSPAWN = (re.compile(r"^systemd-nspawn@(.+)\.service$"), re.compile(r"^machine-(.+)\.scope$"))
_UNIT_SUFFIXES = (".service", ".scope", ".socket", ".mount", ".timer", ".swap", ".target", ".path")

# Annotations of the OCI bundle (CRI: containerd; CRI-O and Podman; nerdctl): csplice keeps exactly these
# (`csplice --list-annotations`, tests/local/test_csplice_contract.py).
ANNOTATIONS = {
    "pod_name": ("io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"),
    "pod_namespace": ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace", "nerdctl/namespace"),
    "pod_uid": ("io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid"),
    "container_name": ("io.kubernetes.cri.container-name", "io.kubernetes.container.name", "nerdctl/name"),
    "image": ("io.kubernetes.cri.image-name", "io.kubernetes.cri-o.ImageName", "org.opencontainers.image.ref.name"),
    # The pod's own choice of what its crashes keep (corehandler/pods/policy.py), where the runtime passes pod
    # annotations into the bundle: Podman's kube play does, containerd with pod_annotations = ["corehandler.io/*"].
    "core_annotation": ("corehandler.io/core",),
}
MAX_FIELD = 256


def cgroup_path(text: str | None) -> str | None:
    """The path that names the process's unit and container (see the module's docstring)."""
    lines = [line.split(":", 2) for line in (text or "").splitlines() if line.count(":") >= 2]
    unified = next((p for h, c, p in lines if h == "0" and c == ""), None)
    if unified and unified != "/":
        return unified
    named = next((p for _, c, p in lines if c == "name=systemd"), None)
    if named:
        return named
    return unified or next((p for _, _, p in lines), None)


def _unescape_unit(name: str) -> str:
    """systemd's \\xNN escapes in unit names (machine-foo\\x2dbar.scope)."""
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), name)


def parse_cgroup(path: str | None) -> dict[str, Any]:
    """runtime, container_id, pod_uid, unit, slice, machine from one cgroup path."""
    out: dict[str, Any] = {"cgroup": path, "runtime": None, "container_id": None, "pod_uid": None, "unit": None,
                           "slice": None, "user_unit": None, "machine": None}
    if not path:
        return out
    parts = [p for p in path.split("/") if p]
    user_manager = None
    for i, part in enumerate(parts):
        if user_manager is not None:
            # Below user@UID.service every name is the user's to choose: it attributes nothing to a container
            # or a pod (rootless containers included: csplice can vouch for none of them).
            if part.endswith(_UNIT_SUFFIXES):
                out["user_unit"] = out["user_unit"] or part
            continue
        for runtime, pattern in _CONTAINER_COMPONENTS:
            m = pattern.match(part)
            if m and out["container_id"] is None:
                out["runtime"], out["container_id"] = runtime, m.group(1)
        m = _BARE_ID.match(part)
        if m and out["container_id"] is None:
            parent = parts[i - 1] if i else ""
            out["container_id"] = m.group(1)
            out["runtime"] = _PARENTS.get(parent, CONTAINERD if parent.startswith("pod") else None)
        m = _POD.match(part)
        if m:
            out["pod_uid"] = m.group(1).replace("_", "-")
        for pattern in _NSPAWN:
            m = pattern.match(part)
            if m and out["machine"] is None and out["container_id"] is None:
                out["machine"] = _unescape_unit(m.group(1))
        if part.endswith(".slice"):
            out["slice"] = part
        elif part.endswith(_UNIT_SUFFIXES):
            if part.startswith("user@") and part.endswith(".service"):
                user_manager = part
                out["unit"] = part
            elif out["unit"] is None:
                out["unit"] = part
    if out["machine"] is not None and out["runtime"] is None:
        out["runtime"] = NSPAWN
    if out["pod_uid"] and out["runtime"] is None and out["container_id"]:
        out["runtime"] = CONTAINERD
    if out["runtime"] is None and out["unit"]:
        out["runtime"] = SYSTEMD
    return out


def nspid(status: str | None) -> list[int] | None:
    """The PIDs of the process in each PID namespace, outermost first (NSpid in /proc/PID/status)."""
    for line in (status or "").splitlines():
        if line.startswith("NSpid:"):
            try:
                return [int(x) for x in line.split()[1:]]
            except ValueError:
                return None
    return None


_NS_LINK = re.compile(r"^\w+:\[(\d+)\]$")


def namespaces(ns: Any) -> dict[str, int]:
    """{"pid": 4026531836, ...} from csplice's readlinks ("pid:[4026531836]")."""
    out = {}
    if isinstance(ns, Mapping):
        for name, link in ns.items():
            m = _NS_LINK.match(link) if isinstance(link, str) else None
            if m and isinstance(name, str) and name.isidentifier():
                out[name] = int(m.group(1))
    return out


def container(proc: Mapping[str, Any]) -> tuple[str | None, str | None, dict[str, str]]:
    """csplice's proc.container: (id, runtime, annotations), each checked for its type."""
    found = proc.get("container") if isinstance(proc.get("container"), Mapping) else {}
    cid, runtime = found.get("id"), found.get("runtime")
    notes = found.get("annotations") if isinstance(found.get("annotations"), Mapping) else {}
    return (cid if isinstance(cid, str) and _BARE_ID.match(cid) else None,
            runtime if isinstance(runtime, str) else None,
            {str(k)[:MAX_FIELD]: v[:MAX_FIELD] for k, v in notes.items() if isinstance(v, str)})


def identify(record: Mapping[str, Any]) -> dict[str, Any]:
    """Everything this module knows of the process, from its record."""
    proc = record.get("proc") if isinstance(record.get("proc"), Mapping) else {}
    cgroup = proc.get("cgroup") if isinstance(proc.get("cgroup"), str) else None
    out = parse_cgroup(cgroup_path(cgroup))
    pids = nspid(proc.get("status") if isinstance(proc.get("status"), str) else None)
    out["nspid"] = pids
    out["pid_in_namespace"] = pids[-1] if pids else None
    out["namespaces"] = namespaces(proc.get("ns"))
    cid, runtime, found = container(proc)
    if cid:
        out["container_id"], out["runtime"] = cid, runtime or out["runtime"]
    for key, names in ANNOTATIONS.items():
        value = next((found[n] for n in names if n in found), None)
        if key == "pod_uid":
            out["pod_uid"] = out["pod_uid"] or value
        else:
            out[key] = value
    return out
