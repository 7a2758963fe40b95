"""Parsing eu-stack output (corehandler/analysis/unwind.py) on crafted text: the shapes a real run
rarely shows (newlines in symbols, megabyte names, thousands of threads, errors)."""

import io

from corehandler.analysis import findings

BID = "3d7246d4cd6c9b2cff30032b2a5efcf0dbf058c5"


def stack(text, **limits):
    return findings.parse_stack(io.BytesIO(text.encode("utf-8", "surrogateescape")), findings.Limits(**limits))


def frame(i, function, module="t", offset=0x1186):
    head = f"#{i:<2} 0x{0x555555554000 + offset:016x}" + (f" {function}" if function else "") + f" - {module}\n"
    return head + f"    [{BID}]@0x555555554000+{offset:#x}\n"


def test_frames_build_ids_and_sources():
    out = stack("PID 1 - core\nTID 7:\n" + frame(0, "crash") + "    /src/t.c:6:74\n" + frame(1, None, "/bin/t")
                + "#2  0x0000000000000000\n")
    (t,) = out["threads"]
    assert t["tid"] == 7
    f0, f1, f2 = t["frames"]
    assert (f0["function"], f0["module"], f0["build_id"], f0["offset"], f0["file"], f0["line"]) == \
        ("crash", "t", BID, 0x1186, "/src/t.c", 6)
    assert (f1["function"], f1["module"]) == (None, "/bin/t")
    assert (f2["pc"], f2["module"], f2["offset"]) == (0, None, None)


def test_symbol_with_newline_and_control_characters_is_kept_and_printed_escaped():
    text = "TID 7:\n#0  0x0000555555555186 evil\nname\x1b[31m\u202e\x9b - t\n" + f"    [{BID}]@0x555555554000+0x1186\n"
    f = stack(text)["threads"][0]["frames"][0]
    assert f["function"] == "evil\nname\x1b[31m\u202e\x9b" and f["module"] == "t" and f["offset"] == 0x1186
    assert "evil\\nname\\x1b[31m\\u202e\\u009b (t + 0x1186)" in findings.frame_line(f)


def test_undecodable_bytes_are_printed_escaped():
    f = stack("TID 7:\n#0  0x0000555555555186 caf\udce9 - t\n")["threads"][0]["frames"][0]
    assert f["function"] == "caf\udce9" and " caf\\xe9 (t)" in findings.frame_line(f)


def test_megabyte_symbol_is_cut_and_parsing_goes_on():
    huge = "std::vector<" * 100000
    out = stack("TID 7:\n" + frame(0, huge) + frame(1, "main"), line_chars=512)
    f0, f1 = out["threads"][0]["frames"]
    assert len(f0["function"]) < 600 and f0["function"].endswith("...[cut]")
    assert f1["function"] == "main" and out["lines_cut"] == 1


def test_threads_and_frames_are_capped():
    text = "".join(f"TID {tid}:\n" + "".join(frame(i, f"f{i}") for i in range(100)) for tid in range(1, 3001))
    out = stack(text, threads=64, frames=64)
    assert len(out["threads"]) == 64 and out["threads_seen"] == 3000 and out["threads_cut"]
    assert all(len(t["frames"]) == 64 for t in out["threads"])


def test_errors_go_on_their_threads():
    out = stack("TID 7:\n" + frame(0, "crash") + "TID 8:\n" + frame(0, "idle"))
    err = io.BytesIO(b"/usr/bin/eu-stack: dwfl_thread_getframes tid 8 at 0x5555 in <unknown>: No DWARF\n"
                     b"eu-stack: tid 7: shown max number of frames (64, use -n 0 for unlimited)\n"
                     b"eu-stack: something else\n")
    problems = findings.apply_errors(out, err, findings.Limits())
    t7, t8 = out["threads"]
    assert t7["frames_cut"] and t8["error"] == "No DWARF" and problems == ["eu-stack: something else"]


def test_crashing_thread_first_by_tid():
    out = stack("TID 1:\n" + frame(0, "idle") + "TID 9:\n" + frame(0, "crash"))
    result = findings.build_result({"tid": 9, "signal": 11, "proc": {"exe": "/nonexistent/t (deleted)"}}, out, [],
                                   False, [], False)
    assert [t["tid"] for t in result["threads"]] == [9, 1]
    assert result["threads"][0]["crashing"] and not result["threads"][1]["crashing"]
    assert result["signature"].startswith("t SIGSEGV crash")
    assert result["exe"]["state"] == "deleted" and result["state"] == findings.PARTIAL


def test_no_frames_is_failed():
    result = findings.build_result({"tid": 9}, stack(""), [], False, ["eu-stack killed by SIGSEGV"], False)
    assert result["state"] == findings.FAILED and "signature" not in result


def test_exe_module():
    modules = [{"name": "/usr/lib/libc.so.6"}, {"name": "/tmp/t (deleted)"}]
    assert findings.exe_module(modules, "/tmp/t (deleted)") is modules[1]
    assert findings.exe_module(modules, "/other") is modules[0] and findings.exe_module([], "/x") is None


def test_cut():
    assert findings._cut("a\nb\udcff", 100) == "a\nb\udcff"
    assert findings._cut("x" * 10, 4) == "xxxx...[cut]"
