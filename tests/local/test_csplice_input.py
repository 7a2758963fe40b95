"""Bad input: empty and non-ELF streams, a crashed process whose /proc lies, hostile names. Each gets a
committed record saying what happened, and nothing is written outside the spool. (Input the kernel never gives,
a PID that is not alive or stdin that is no pipe, is refused with nothing stored: test_csplice_caller.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from corehandler.analysis import identity
from support.csplice_harness import Handler, core_args, make_fake_proc, rate_file, spool_files


@pytest.fixture
def handler(tmp_path):
    return Handler(tmp_path / "h")


def tree(root: Path) -> dict[str, bytes]:
    """Every file below root with its content (symlinks as their target), to prove nothing else changed."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = b"-> " + os.fsencode(os.readlink(p))
        elif p.is_file():
            out[rel] = p.read_bytes()
        else:
            out[rel] = b"<dir>"
    return out


def test_empty_stream_is_recorded_as_metadata_only(handler):
    """Nothing came, so nothing is kept: no empty core file that would look like a dump."""
    result = handler.feed(0)
    assert result.returncode == 0
    cap = result.capture
    assert result.record["core"] is None and cap["bytes"] == 0 and not cap["elf_magic"]
    assert (cap["complete"], cap["dropped"], cap["dropped_reason"]) == (False, True, "empty")
    assert spool_files(handler.spool) == [f"{result.record['id']}.json"]
    assert any("dropped (empty)" in e for e in result.record["errors"])


def test_non_elf_stream_is_kept_as_it_is(handler):
    data = b"this is no core\n" * 10_000
    result = handler.run(stdin=data)
    assert result.returncode == 0
    cap = result.capture
    assert cap["complete"] and not cap["elf_magic"] and cap["bytes"] == len(data)
    assert result.core.read_bytes() == data
    assert any("not an ELF file" in e for e in result.record["errors"])


def test_fake_proc_is_read_and_verified_by_start_time(handler, tmp_path):
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"fakeproc", [b"/usr/bin/fake", b"--flag"], b"/usr/bin/fake")
    handler.env["CSPLICE_PROC_ROOT"] = str(proc_root)
    rec = handler.feed(4096, pid=4242).record
    proc = rec["proc"]
    assert proc["available"] and proc["exe"] == "/usr/bin/fake" and proc["comm"] == "fakeproc"
    assert proc["cmdline"] == ["/usr/bin/fake", "--flag"]
    assert proc["cgroup"] == "0::/fake.slice/fake.service\n" and "Pid:\t4242" in proc["status"]
    assert (proc["verified_by"], proc["verified"]) == ("start_time", True)
    assert rec["boot_id"] == "0123456789abcdef0123456789abcdef"
    assert rec["id"].split("-")[1] == "0123456789abcdef"


def test_reused_pid_is_flagged(handler, tmp_path):
    """/proc/PID belongs to a process that started after the crash: the PID was reused."""
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"newcomer", [b"x"], b"/usr/bin/x", started_ago=-120)
    handler.env["CSPLICE_PROC_ROOT"] = str(proc_root)
    rec = handler.feed(4096, pid=4242).record
    assert (rec["proc"]["verified_by"], rec["proc"]["verified"]) == ("start_time", False)
    assert any("not the crashed process" in e for e in rec["errors"])
    assert_nothing_of_the_process(rec["proc"])
    assert rec["capture"]["complete"]


def test_pidfd_verification(handler, tmp_path):
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"fakeproc", [b"x"], b"/usr/bin/x", pidfd=5)
    handler.env["CSPLICE_PROC_ROOT"] = str(proc_root)
    rec = handler.feed(4096, pid=4242, args=core_args(4242, pidfd=5)).record
    assert rec["specifiers"]["F"] == "5"
    assert (rec["proc"]["verified_by"], rec["proc"]["verified"]) == ("pidfd", True)


def test_pidfd_naming_another_process_keeps_nothing_of_that_process(handler, tmp_path):
    """The pidfd is the crashed process: when it names another PID, /proc/PID is someone else's, whatever its
    start time says, and nothing read there goes in the record."""
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"newcomer", [b"secret-arg"], b"/usr/bin/x", pidfd=5)
    (proc_root / "self/fdinfo/5").write_text("pos:\t0\nPid:\t999\n")
    handler.env["CSPLICE_PROC_ROOT"] = str(proc_root)
    rec = handler.feed(4096, pid=4242, args=core_args(4242, pidfd=5)).record
    assert (rec["proc"]["verified_by"], rec["proc"]["verified"]) == ("pidfd", False)
    assert_nothing_of_the_process(rec["proc"])
    assert rec["capture"]["complete"]


def test_an_unreadable_pidfd_falls_back_to_start_time(handler, tmp_path):
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"fakeproc", [b"x"], b"/usr/bin/x")
    handler.env["CSPLICE_PROC_ROOT"] = str(proc_root)
    rec = handler.feed(4096, pid=4242, args=core_args(4242, pidfd=5)).record
    assert (rec["proc"]["verified_by"], rec["proc"]["verified"]) == ("start_time", True)
    assert rec["proc"]["cmdline"] == ["x"]


def assert_nothing_of_the_process(proc: dict) -> None:
    assert [proc[k] for k in ("exe", "comm", "cmdline", "status", "cgroup", "container")] == [None] * 6
    assert all(v is None for v in proc["ns"].values())


def test_record_fields_are_capped_and_say_so(handler, tmp_path):
    """A 64 KiB argv of high bytes (six record bytes each) made a 700 KiB record; each /proc text csplice quotes
    is cut at its cap, and proc.truncated names the ones that were."""
    argv = [b"\xff" * 1000] * 66
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"fakeproc", argv, b"/usr/bin/x")
    (proc_root / "4242" / "cgroup").write_bytes(b"0::/" + b"/".join([b"\xfe" * 200] * 60) + b"\n")
    (proc_root / "4242" / "environ").write_bytes(b"K=" + b"\x80" * 100_000 + b"\0")
    handler.env["CSPLICE_PROC_ROOT"] = str(proc_root)
    handler.configure(collect_environ=True)
    result = handler.feed(4096, pid=4242)
    proc = result.record["proc"]
    assert proc["truncated"] == ["cmdline", "cgroup", "environ"]
    raw = b"".join(a.encode("utf-8", "surrogateescape") + b"\0" for a in proc["cmdline"])
    assert raw == b"".join(a + b"\0" for a in argv)[:4096] + b"\0"  # the last argument cut short
    assert len(proc["cgroup"].encode("utf-8", "surrogateescape")) == 8192
    assert len(proc["environ"][0].encode("utf-8", "surrogateescape")) == 32768
    assert Path(handler.spool, result.record["id"] + ".json").stat().st_size < 300 * 1024


HOSTILE = [
    b"../../etc/passwd",
    b"a/b/c",
    b"with space  and\ttab",
    b"new\nline",
    b"\xff\xfe not utf-8 \xc3(",
    b"-dash",
    b".",
    b"",
]


@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_hostile_names_round_trip_and_stay_in_the_spool(handler, tmp_path, name):
    proc_root = make_fake_proc(tmp_path / "proc", 4242, name[:15] or b"x", [name, b"arg\xff\n"], b"/opt/" + name)
    handler.env["CSPLICE_PROC_ROOT"] = str(proc_root)
    handler.configure(max_per_exe_per_minute=16, max_pending=64)
    outside = tree(tmp_path)
    result = handler.feed(4096, pid=4242, args=core_args(4242, comm=name))
    assert result.returncode == 0 and result.capture["complete"]
    rec = result.record

    def raw(s):
        return s.encode("utf-8", "surrogateescape")

    # An empty argument is "not given": null, not "".
    assert rec["comm"] is None if name == b"" else raw(rec["comm"]) == name
    assert raw(rec["proc"]["comm"]) == (name[:15] or b"x")
    assert [raw(a) for a in rec["proc"]["cmdline"]] == [name, b"arg\xff\n"]
    assert raw(rec["proc"]["exe"]) == b"/opt/" + name
    # The spool holds the id's two files and the rate counter; no name of the process's choosing.
    assert spool_files(handler.spool) == sorted([".rate", ".rate/" + rate_file(b"/opt/" + name),
                                                 rec["id"] + ".core", rec["id"] + ".json"])
    after = tree(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("h/spool")} == \
        {k: v for k, v in outside.items() if not k.startswith("h/spool")}


CID = "ab" * 32
SECRET = "DB_PASSWORD=hunter2-from-secretKeyRef"
HOST_MNT, CTR_MNT, CTR_PID = "mnt:[4026531841]", "mnt:[4026532299]", "pid:[4026532300]"
ANNOTATIONS = {"io.kubernetes.cri.container-name": "web", "io.kubernetes.cri.sandbox-name": "web-0",
               "io.kubernetes.cri.sandbox-namespace": "shop"}


def set_ns(proc_root: Path, pid: int, mnt: str, pidns: str) -> None:
    (proc_root / str(pid) / "ns").mkdir(parents=True, exist_ok=True)
    for name, link in (("mnt", mnt), ("pid", pidns)):
        os.symlink(link, proc_root / str(pid) / "ns" / name)


def fake_container(tmp_path: Path, cgroup: str, *, mnt: str = CTR_MNT, pidns: str = CTR_PID,
                   bundle: str = f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{CID}", pidfile="init.pid",
                   config: str | None = None, config_dir: str | None = None) -> tuple[Path, Path]:
    """A /proc with the crashed PID 4242 in `cgroup` with namespaces (mnt, pidns), the host's PID 1, and a
    container whose init (PID 77) runs in CTR_MNT/CTR_PID, its bundle (init pid, config.json with a secret in
    process.env) under <tmp>/run. Returns (proc root, bundle root)."""
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"fakeproc", [b"x"], b"/usr/bin/x")
    (proc_root / "4242" / "cgroup").write_text(cgroup)
    set_ns(proc_root, 4242, mnt, pidns)
    set_ns(proc_root, 1, HOST_MNT, "pid:[4026531836]")
    set_ns(proc_root, 77, CTR_MNT, CTR_PID)
    d = tmp_path / "run" / bundle
    d.mkdir(parents=True)
    (d / pidfile).write_text("77")
    if config_dir is not None:
        d = tmp_path / "run" / config_dir
        d.mkdir(parents=True)
    (d / "config.json").write_text(config if config is not None else json.dumps(
        {"ociVersion": "1.1.0", "process": {"env": ["PATH=/bin", SECRET], "args": ["/app"]},
         "annotations": {**ANNOTATIONS, "kubectl.kubernetes.io/last-applied-configuration": SECRET},
         "linux": {"x": "y" * 100000}}))
    return proc_root, tmp_path / "run"


def crash_in(handler, proc_root: Path, bundle_root: Path) -> dict:
    handler.env.update(CSPLICE_PROC_ROOT=str(proc_root), CSPLICE_BUNDLE_ROOT=str(bundle_root))
    result = handler.feed(4096, pid=4242)
    assert "hunter2" not in Path(handler.spool, result.record["id"] + ".json").read_text()
    return result.record["proc"]


def test_a_container_is_named_by_its_bundles_annotations_and_nothing_else(handler, tmp_path):
    """procinfo.c keeps /proc/PID/ns/* readlinks; container.c, for a runtime's own cgroup form and a process
    in its bundle init's namespaces, only the annotations that name the container: never process.env."""
    cgroup = f"0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-{CID}.scope\n"
    proc = crash_in(handler, *fake_container(tmp_path, cgroup))
    assert proc["ns"]["pid"] == CTR_PID and proc["ns"]["mnt"] == CTR_MNT
    assert proc["ns"]["net"] is None and set(proc["ns"]) == {"cgroup", "ipc", "mnt", "net", "pid", "time", "user",
                                                              "uts"}
    assert proc["container"] == {"id": CID, "runtime": "containerd", "annotations": ANNOTATIONS}
    ident = identity.identify({"proc": proc})
    assert (ident["runtime"], ident["container_id"], ident["container_name"], ident["pod_name"]) == \
        ("containerd", CID, "web", "web-0")
    assert ident["namespaces"]["pid"] == 4026532300


@pytest.mark.parametrize("cgroup, bundle, pidfile", [
    (f"0::/system.slice/docker-{CID}.scope\n", f"run/containerd/io.containerd.runtime.v2.task/moby/{CID}",
     "init.pid"),
    (f"12:pids:/docker/{CID}\n1:name=systemd:/docker/{CID}\n0::/\n",
     f"run/docker/containerd/daemon/io.containerd.runtime.v1.linux/moby/{CID}", "init.pid"),
    (f"0::/kubepods/burstable/pod1234/{CID}\n", f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{CID}",
     "init.pid"),
    (f"0::/kubepods.slice/kubepods-pod1.slice/crio-{CID}.scope/container\n",
     f"run/containers/storage/overlay-containers/{CID}/userdata", "pidfile"),
    (f"0::/machine.slice/libpod-{CID}.scope/container\n",
     f"var/lib/containers/storage/overlay-containers/{CID}/userdata", "pidfile"),
    (f"0::/libpod_parent/libpod-{CID}\n", f"run/containers/storage/overlay-containers/{CID}/userdata", "pidfile"),
], ids=["docker-systemd", "docker-cgroupfs-v1", "containerd-cgroupfs", "crio", "podman", "podman-cgroupfs"])
def test_each_runtimes_own_cgroup_form_finds_its_bundle(handler, tmp_path, cgroup, bundle, pidfile):
    proc = crash_in(handler, *fake_container(tmp_path, cgroup, bundle=bundle, pidfile=pidfile))
    assert proc["container"]["id"] == CID and proc["container"]["annotations"] == ANNOTATIONS


def test_podmans_pid_file_and_bundle_are_found_in_its_run_and_static_dirs(handler, tmp_path):
    """Podman 4 (Debian 12's, tests/containers/) writes conmon's PID file into its run dir and config.json into
    its static dir: each is looked for on its own."""
    proc = crash_in(handler, *fake_container(
        tmp_path, f"12:memory:/libpod_parent/libpod-{CID}\n0::/\n", pidfile="pidfile",
        bundle=f"run/containers/storage/overlay-containers/{CID}/userdata",
        config_dir=f"var/lib/containers/storage/overlay-containers/{CID}/userdata"))
    assert proc["container"] == {"id": CID, "runtime": "podman", "annotations": ANNOTATIONS}


@pytest.mark.parametrize("cgroup, ns", [
    # A user names a delegated cgroup after the victim (systemd-run --user --scope --unit=docker-ID.scope).
    (f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/cri-containerd-{CID}.scope\n", {}),
    (f"1:name=systemd:/user.slice/user-1000.slice/user@1000.service/app.slice/docker-{CID}.scope\n"
     f"0::/kubepods/burstable/pod1234/{CID}\n", {}),
    # Not a runtime's form: the id inside a longer name, or under a parent no runtime uses.
    (f"0::/system.slice/evil-{CID}.scope\n", {}),
    (f"0::/system.slice/{CID}\n", {}),
    (f"0::/system.slice/cri-containerd-{CID}.scope.x\n", {}),
    # The runtime's form outside a user manager, but the process is in the host's namespaces, or in its own.
    (f"0::/kubepods/burstable/pod1234/{CID}\n", dict(mnt=HOST_MNT, pidns=CTR_PID)),
    (f"0::/kubepods/burstable/pod1234/{CID}\n", dict(mnt="mnt:[4026539999]", pidns="pid:[4026539998]")),
    (f"0::/kubepods/burstable/pod1234/{CID}\n", dict(mnt=CTR_MNT, pidns="pid:[4026539998]")),
], ids=["user-delegated", "user-delegated-any-hierarchy", "embedded-id", "bare-id-any-parent", "suffix",
        "host-namespaces", "own-namespaces", "other-pid-namespace"])
def test_no_bundle_is_read_for_a_cgroup_the_process_could_name(handler, tmp_path, cgroup, ns):
    proc = crash_in(handler, *fake_container(tmp_path, cgroup, **ns))
    assert proc["container"] is None
    ident = identity.identify({"proc": proc})
    assert (ident["pod_name"], ident["container_name"]) == (None, None)


@pytest.mark.parametrize("self_mnt", [CTR_MNT, None], ids=["ours", "unreadable"])
def test_a_hidden_pid_1_leaves_our_own_mount_namespace_as_the_hosts(handler, tmp_path, self_mnt):
    """Some sandboxes hide PID 1's namespaces even from root: csplice's own (the kernel starts it in the initial
    ones) is the reference then, and with neither readable no bundle is trusted. Here the host's mount namespace
    is the container's, as a stale init.pid naming a host process would make it."""
    proc_root, bundles = fake_container(tmp_path, f"0::/kubepods/burstable/pod1234/{CID}\n")
    for name in ("mnt", "pid"):
        (proc_root / "1" / "ns" / name).unlink()
    if self_mnt:
        (proc_root / "self" / "ns").mkdir(parents=True)
        os.symlink(self_mnt, proc_root / "self" / "ns" / "mnt")
    assert crash_in(handler, proc_root, bundles)["container"] is None


@pytest.mark.parametrize("config, annotations", [
    ('{"process": {"env": ["A=\\"annotations\\": {\\"io.kubernetes.pod.name\\": \\"fake\\"}"]}, "annotations": '
     '{"io.kubernetes.pod.name": "real\\u00e9\\ud83d\\ude00"}}', {"io.kubernetes.pod.name": "real\u00e9\U0001f600"}),
    ('{"process": {"args": ' + "[" * 100000 + "]" * 100000 + '}, "annotations": {"nerdctl/name": "deep"}}',
     {"nerdctl/name": "deep"}),
    ('{"annotations": {"io.kubernetes.pod.name": "' + "x" * 300 + '", "nerdctl/name": 5, "nerdctl/namespace": "n"}}',
     {"nerdctl/namespace": "n"}),
    ('{"annotations": {"io.kubernetes.pod.name": "cut', {}),
    ('{"process": {"env": ["x"]}, "annotations": {"a": [}', {}),
    ('[1, 2]', {}),
    ('', {}),
], ids=["env-lookalike-and-escapes", "deep-nesting", "long-and-typed", "cut-off", "malformed", "array", "empty"])
def test_hostile_bundle_configs(handler, tmp_path, config, annotations):
    cgroup = f"0::/kubepods/burstable/pod1234/{CID}\n"
    proc = crash_in(handler, *fake_container(tmp_path, cgroup, config=config))
    assert proc["container"]["annotations"] == annotations


def test_no_container_no_bundle_read(handler, tmp_path):
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"fakeproc", [b"x"], b"/usr/bin/x")
    handler.env.update(CSPLICE_PROC_ROOT=str(proc_root), CSPLICE_BUNDLE_ROOT=str(tmp_path / "none"))
    proc = handler.feed(4096, pid=4242).record["proc"]
    assert proc["container"] is None and all(v is None for v in proc["ns"].values())
