"""Real crashes through the live kernel's core_pattern, in cgroups built by hand: a user's delegated cgroup named
after a victim container's id never gets that container's bundle (its process.env holds the secrets), nor does
a host process in the runtime's own cgroup form; a process really in the container (its init's mount and PID
namespaces) gets the bundle's naming annotations, and only those.

systemd is not PID 1 on every test machine, so the cgroups are made here, below a private top-level directory
of the cgroup2 hierarchy, as the runtimes and systemd would name them; the bundle is a fake containerd tree
(CSPLICE_BUNDLE_ROOT, set by a wrapper the pattern runs, since the kernel passes no environment)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from corehandler import paths
from corehandler.config import CaptureConfig
from corehandler.csplice_contract import SPECIFIERS
from support.crash import build_crasher
from support.daemon_harness import wait_for
from support.host_core import capture_into

pytestmark = [pytest.mark.root, pytest.mark.live_kernel]

NOBODY = 65534
VICTIM = "5e" * 32
SECRET = "STRIPE_KEY=sk_live_from_secretKeyRef"
ANNOTATIONS = {"io.kubernetes.cri.container-name": "payments", "io.kubernetes.cri.sandbox-name": "payments-0",
               "io.kubernetes.cri.sandbox-namespace": "billing"}


def cgroup2_root() -> Path:
    """Where the cgroup2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        if right.split()[0] == "cgroup2":
            return Path(left.split()[4])
    pytest.fail("no cgroup2 hierarchy mounted")


@pytest.fixture
def world(host_core_settings):
    """A spool, the pattern through a wrapper that points csplice at a fake bundle tree, a private cgroup
    subtree, and a victim container: an init in its own mount and PID namespaces with its bundle."""
    base = Path(tempfile.mkdtemp(prefix="cht-ctr-", dir="/run"))
    os.chmod(base, 0o711)  # nobody must reach the crasher
    top = cgroup2_root() / base.name
    victim = None
    try:
        state, bundles = base / "state", base / "b"
        (state / "spool").mkdir(mode=0o700, parents=True)
        crasher = build_crasher(base / "bin")
        os.chmod(base / "bin", 0o755)
        wrapper = base / "w"
        wrapper.write_text(f"#!/bin/sh\nCSPLICE_BUNDLE_ROOT={bundles} exec {paths.csplice_path()} \"$@\"\n")
        wrapper.chmod(0o700)
        capture_into(host_core_settings, state,
                     CaptureConfig.model_validate({"min_free": "0", "max_per_exe_per_minute": 0}),
                     pattern=f"|{wrapper} {SPECIFIERS}")

        victim = subprocess.Popen(["unshare", "--mount", "--pid", "--fork", "sleep", "600"])
        init = wait_for(lambda: _only_child(victim.pid), what="the victim's init")
        bundle = bundles / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{VICTIM}"
        bundle.mkdir(parents=True)
        (bundle / "init.pid").write_text(str(init))
        (bundle / "config.json").write_text(json.dumps({
            "ociVersion": "1.1.0", "process": {"args": ["/pay"], "env": ["PATH=/bin", SECRET]},
            "annotations": ANNOTATIONS, "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}]}}))
        yield _World(state / "spool", crasher, top, init)
    finally:
        if victim is not None:
            victim.kill()
            victim.wait()
        for d in sorted(top.rglob("*"), key=lambda p: -len(p.parts)) + [top]:
            if d.is_dir():
                wait_for(lambda d=d: _rmdir(d), what=f"{d} emptied")
        shutil.rmtree(base)


def _only_child(pid: int) -> int | None:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(children[0]) if children else None


def _rmdir(d: Path) -> bool:
    try:
        d.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


class _World:
    def __init__(self, spool: Path, crasher: Path, top: Path, init: int):
        self.spool, self.crasher, self.top, self.init = spool, crasher, top, init

    def crash(self, cgroup: str, *, uid: int = 0, enter_victim: bool = False) -> dict:
        """Crashes the crasher in top/cgroup (as uid, or inside the victim's namespaces); returns its record."""
        d = self.top / cgroup
        d.mkdir(parents=True, exist_ok=True)
        before = set(os.listdir(self.spool)) if self.spool.exists() else set()

        def enter():
            (d / "cgroup.procs").write_text(str(os.getpid()))
            # nsenter re-raises its child's signal: 1 is the kernel's "no dump" for pipe handlers (its own).
            soft = 1 if enter_victim else resource.RLIM_INFINITY
            resource.setrlimit(resource.RLIMIT_CORE, (soft, resource.RLIM_INFINITY))
            if uid:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)

        argv = [str(self.crasher), "segv", "1"]
        if enter_victim:
            argv = ["nsenter", "-t", str(self.init), "-m", "-p", "--", "sh", "-c", 'ulimit -S -c unlimited; exec "$@"',
                    "sh"] + argv
        got = subprocess.run(argv, preexec_fn=enter, capture_output=True, timeout=120)
        assert got.returncode in (-signal.SIGSEGV, 128 + signal.SIGSEGV), got

        def new_records():
            return [n for n in set(os.listdir(self.spool)) - before if n.endswith(".json")]

        [name] = wait_for(new_records, what="the crash's record")
        text = (self.spool / name).read_text()
        assert "sk_live" not in text
        return json.loads(text)


def test_a_users_cgroup_named_after_a_victim_container_gets_nothing_of_it(world):
    """What `systemd-run --user --scope --unit=cri-containerd-ID.scope` makes: a crash there read the victim's
    config.json, process.env and all, into the record the user is shown."""
    rec = world.crash(f"user.slice/user-1000.slice/user@1000.service/app.slice/cri-containerd-{VICTIM}.scope",
                      uid=NOBODY)
    assert rec["uid"] == NOBODY and rec["proc"]["verified"]
    assert rec["proc"]["container"] is None and "oci_config" not in rec["proc"]


def test_a_host_process_in_the_runtimes_cgroup_form_gets_nothing_either(world):
    rec = world.crash(f"kubepods/burstable/pod1234/{VICTIM}")
    assert f"/kubepods/burstable/pod1234/{VICTIM}\n" in rec["proc"]["cgroup"]
    assert rec["proc"]["container"] is None


def test_a_process_in_the_container_gets_its_annotations_only(world):
    rec = world.crash(f"kubepods/burstable/pod1234/{VICTIM}", enter_victim=True)
    assert rec["proc"]["ns"]["mnt"] == os.readlink(f"/proc/{world.init}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    assert rec["proc"]["container"] == {"id": VICTIM, "runtime": "containerd", "annotations": ANNOTATIONS}
