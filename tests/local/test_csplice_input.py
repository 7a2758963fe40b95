"""Bad input: empty and non-ELF streams, a crashed process whose /proc lies, hostile names. Each gets a
committed record saying what happened, and nothing is written outside the spool. (Input the kernel never gives,
a PID that is not alive or stdin that is no pipe, is refused with nothing stored: test_csplice_caller.py.)"""

from __future__ import annotations

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
    assert rec["capture"]["complete"]


def test_pidfd_verification(handler, tmp_path):
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"fakeproc", [b"x"], b"/usr/bin/x", pidfd=5)
    handler.env["CSPLICE_PROC_ROOT"] = str(proc_root)
    rec = handler.feed(4096, pid=4242, args=core_args(4242, pidfd=5)).record
    assert rec["specifiers"]["F"] == "5"
    assert (rec["proc"]["verified_by"], rec["proc"]["verified"]) == ("pidfd", True)


def test_pidfd_naming_another_process_falls_back_to_start_time(handler, tmp_path):
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"fakeproc", [b"x"], b"/usr/bin/x", pidfd=5)
    (proc_root / "self/fdinfo/5").write_text("pos:\t0\nPid:\t999\n")
    handler.env["CSPLICE_PROC_ROOT"] = str(proc_root)
    rec = handler.feed(4096, pid=4242, args=core_args(4242, pidfd=5)).record
    assert (rec["proc"]["verified_by"], rec["proc"]["verified"]) == ("start_time", True)


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



def test_namespaces_and_the_oci_bundle_are_read(handler, tmp_path):
    """procinfo.c keeps /proc/PID/ns/* readlinks and, for a cgroup naming a container, the first bytes of its
    OCI bundle's config.json (here a fake containerd tree under CSPLICE_BUNDLE_ROOT)."""
    cid = "ab" * 32
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"fakeproc", [b"x"], b"/usr/bin/x")
    cgroup = f"0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-{cid}.scope\n"
    (proc_root / "4242" / "cgroup").write_text(cgroup)
    (proc_root / "4242" / "ns").mkdir()
    os.symlink("pid:[4026532300]", proc_root / "4242" / "ns" / "pid")
    os.symlink("mnt:[4026531841]", proc_root / "4242" / "ns" / "mnt")
    bundle = tmp_path / "run" / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{cid}"
    bundle.mkdir(parents=True)
    config = '{"annotations": {"io.kubernetes.cri.container-name": "web"}, "linux": {"x": "' + "y" * 100000 + '"}}'
    (bundle / "config.json").write_text(config)
    handler.env.update(CSPLICE_PROC_ROOT=str(proc_root), CSPLICE_BUNDLE_ROOT=str(tmp_path / "run"))
    proc = handler.feed(4096, pid=4242).record["proc"]
    assert proc["ns"]["pid"] == "pid:[4026532300]" and proc["ns"]["mnt"] == "mnt:[4026531841]"
    assert proc["ns"]["net"] is None and set(proc["ns"]) == {"cgroup", "ipc", "mnt", "net", "pid", "time", "user",
                                                              "uts"}
    assert proc["oci_config"] == config[:64 * 1024]
    ident = identity.identify({"proc": proc})
    assert (ident["runtime"], ident["container_id"], ident["container_name"]) == ("containerd", cid, "web")
    assert ident["namespaces"]["pid"] == 4026532300


def test_no_container_no_bundle_read(handler, tmp_path):
    proc_root = make_fake_proc(tmp_path / "proc", 4242, b"fakeproc", [b"x"], b"/usr/bin/x")
    handler.env.update(CSPLICE_PROC_ROOT=str(proc_root), CSPLICE_BUNDLE_ROOT=str(tmp_path / "none"))
    proc = handler.feed(4096, pid=4242).record["proc"]
    assert proc["oci_config"] is None and all(v is None for v in proc["ns"].values())
