"""The grouping keys (corehandler/analysis/signature.py): pure functions, tested by tables."""

import pytest

from corehandler.analysis import signature


def fr(function=None, module="app", offset=0x10, build_id="aa", pc=0x1000):
    return {"function": function, "module": module, "offset": offset, "build_id": build_id, "pc": pc}


@pytest.mark.parametrize("raw, expected", [
    ("main", "main"),
    ("__GI_raise", "raise"),
    ("__GI___assert_fail", "__assert_fail"),
    ("__libc_start_main@@GLIBC_2.34", "__libc_start_main"),
    ("memcpy@GLIBC_2.2.5", "memcpy"),
    ("parse.isra.0", "parse"),
    ("parse.constprop.3.isra.0", "parse"),
    ("parse.part.1", "parse"),
    ("parse.cold", "parse"),
    ("ns::Foo::bar(int, char const*)", "ns::Foo::bar"),
    ("ns::Foo::bar(int) const", "ns::Foo::bar"),
    ("std::vector<int, std::allocator<int> >::at(unsigned long)", "std::vector<int, std::allocator<int> >::at"),
    ("(anonymous namespace)::helper(void (*)(int))", "(anonymous namespace)::helper"),
    ("(anonymous namespace)::helper", "(anonymous namespace)::helper"),
    ("operator()(int)", "operator()"),
])
def test_normalise_function(raw, expected):
    assert signature.normalise_function(raw) == expected


@pytest.mark.parametrize("frames, expected", [
    # noise on top is dropped, down to the last noise frame
    ([fr("__pthread_kill_implementation"), fr("raise"), fr("abort"), fr("do_assert"), fr("main")],
     ["do_assert", "main"]),
    ([fr("raise"), fr("abort"), fr("__libc_message"), fr("__fortify_fail"), fr("__chk_fail"),
      fr("__strcpy_chk"), fr("copy"), fr("main")], ["copy", "main"]),
    ([fr("__stack_chk_fail"), fr("victim"), fr("main")], ["victim", "main"]),
    # C++: unsymbolised libstdc++ frames between the noise go too
    ([fr("raise"), fr("abort"), fr(None, "libstdc++.so.6", 0x9d918), fr("std::terminate()"), fr("__cxa_throw"),
      fr("app::thrower(int)"), fr("main")], ["app::thrower", "main"]),
    # noise below the top is kept: it is where the program went
    ([fr("crash"), fr("raise"), fr("main")], ["crash", "raise", "main"]),
    # recursion collapses
    ([fr("recurse")] * 64, ["recurse"]),
    ([fr("a"), fr("b"), fr("b"), fr("b"), fr("c")], ["a", "b", "c"]),
    # unsymbolised frames as module+offset, the module's file name only
    ([fr(None, "/usr/bin/app", 0x11ae), fr(None, "/usr/bin/app", 0x1226)], ["app+0x11ae", "app+0x1226"]),
    ([fr(None, None, None, pc=0)], ["0x0"]),
    # at most SIGNATURE_FRAMES
    ([fr(f"f{i}") for i in range(10)], [f"f{i}" for i in range(signature.SIGNATURE_FRAMES)]),
    # all noise: the last frame stays, a signature is never empty
    ([fr("raise"), fr("abort")], ["abort"]),
    ([], []),
])
def test_signature_frames_v1(frames, expected):
    assert signature.signature_frames(frames, version=1) == expected


def test_signature_text_names_exe_and_signal():
    text = signature.signature("/usr/bin/app (deleted)", "SIGSEGV", [fr("crash"), fr("main")])
    assert text == "app SIGSEGV crash < main"
    assert signature.signature("/usr/bin/app", "SIGSEGV", [fr("crash"), fr("main")], 1) == "app SIGSEGV crash < main"
    assert signature.signature(None, None, []) == "? ? (no frames)"


def test_long_function_is_cut():
    assert len(signature.frame_text(fr("x" * 10000))) == signature.MAX_FRAME_CHARS + 3


def test_same_bug_rebuilt_same_signature_other_exact_key():
    old = [fr("crash", offset=0x1146, build_id="aa"), fr("main", offset=0x1200, build_id="aa")]
    new = [fr("crash", offset=0x1186, build_id="bb"), fr("main", offset=0x1250, build_id="bb")]
    a = signature.keys("/bin/app", "aa", 11, "SIGSEGV", old)
    b = signature.keys("/bin/app", "bb", 11, "SIGSEGV", new)
    assert a["signature"] == b["signature"] and a["signature_id"] == b["signature_id"]
    assert a["exact_key"] != b["exact_key"]


@pytest.mark.parametrize("change", [
    lambda k: dict(k, signal=6),
    lambda k: dict(k, build_id="cc"),
    lambda k: dict(k, frames=[fr("crash", offset=0x1147)] + k["frames"][1:]),
])
def test_exact_key_changes_with_each_input(change):
    base = {"build_id": "aa", "signal": 11, "frames": [fr("crash", offset=0x1146), fr("main")]}
    other = change(base)
    assert signature.exact_key(base["build_id"], base["signal"], base["frames"]) != \
        signature.exact_key(other["build_id"], other["signal"], other["frames"])


def test_exact_key_needs_no_symbols_and_reads_top_frames_only():
    a = [fr("crash")] + [fr("x", offset=i) for i in range(20)]
    b = [fr(None)] + [fr(None, offset=i) for i in range(signature.EXACT_FRAMES - 1)] + [fr(None, offset=999)]
    assert signature.exact_key("aa", 11, a) == signature.exact_key("aa", 11, b)


def test_versions_are_in_the_keys():
    k = signature.keys("/bin/app", "aa", 11, "SIGSEGV", [fr("crash")])
    assert k["signature_id"].startswith(f"s{signature.SIGNATURE_VERSION}-")
    assert k["exact_key"].startswith(f"x{signature.EXACT_VERSION}-")
    assert k["signature_version"] == signature.SIGNATURE_VERSION and k["exact_version"] == signature.EXACT_VERSION


# -- version 2: one rule per test, as docs/analysis.md "Grouping keys" lists them ---------------------------

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


def libc(function, offset=0x9a000):
    return fr(function, LIBC, offset, "cc")


@pytest.mark.parametrize("variant, public", [
    # x86_64 (sysdeps/x86_64/multiarch): what glibc picks on EVEX (AVX-512), AVX2 and SSE2 machines
    ("__strlen_evex", "strlen"), ("__strlen_avx2", "strlen"), ("__strlen_sse2", "strlen"),
    ("__strlen_avx2_rtm", "strlen"), ("__strnlen_evex512", "strnlen"), ("__strchr_sse2", "strchr"),
    ("__strcasecmp_l_avx", "strcasecmp_l"), ("__rawmemchr_avx2", "rawmemchr"), ("__wcslen_sse4_1", "wcslen"),
    ("__memmove_avx_unaligned_erms", "memmove"), ("__memmove_evex_unaligned_erms", "memmove"),
    ("__memmove_avx512_no_vzeroupper", "memmove"), ("__memset_avx2_unaligned_erms_rtm", "memset"),
    ("__strcpy_sse2_unaligned", "strcpy"), ("__GI___strlen_sse2", "strlen"), ("__memcmp_avx2_movbe_rtm", "memcmp"),
    ("__memset_erms", "memset"), ("__strlen_vx", "strlen"), ("__strlen_c", "strlen"),  # s390
    # memcpy's variants are memmove's bodies at the same addresses: one name for both
    ("__memcpy_avx_unaligned_erms", "memmove"), ("__memcpy_ssse3_back", "memmove"),
    # aarch64 (sysdeps/aarch64/multiarch)
    ("__memcpy_generic", "memmove"), ("__memcpy_simd", "memmove"), ("__strlen_asimd", "strlen"),
    ("__memset_zva64", "memset"), ("__memchr_nosimd", "memchr"), ("__memcpy_thunderx2", "memmove"),
    ("__strlen_mte", "strlen"), ("__memcpy_sve", "memmove"),
    # not variants: kept as they are
    ("__libc_start_main", "__libc_start_main"), ("__strlen_helper", "__strlen_helper"),
    ("__memcpy_chk", "__memcpy_chk"), ("__parse_avx2", "__parse_avx2"), ("memcpy", "memcpy"),
    ("strlen", "strlen"),
])
def test_v2_folds_ifunc_variants_by_rule(variant, public):
    assert signature.normalise_function(variant) == public
    assert signature.normalise_function(variant, 1) == variant.removeprefix("__GI_")


def test_v2_same_strlen_crash_one_signature_on_evex_avx2_and_sse2_machines():
    """Frames as glibc gives them on three CPUs (the offsets of each variant differ, too): one v2 signature,
    three v1 ones, and three exact keys."""
    def machine(variant, offset):
        return [libc(variant, offset), fr("count_name", "/usr/bin/app", 0x1189),
                fr("main", "/usr/bin/app", 0x11d0), libc("__libc_start_call_main", 0x271c9),
                libc("__libc_start_main_impl", 0x27284), fr("_start", "/usr/bin/app", 0x10a0)]
    keys = [signature.keys("/usr/bin/app", "aa", 11, "SIGSEGV", machine(v, o)) for v, o in
            (("__strlen_evex", 0x1a1a5d), ("__strlen_avx2", 0x19e6bd), ("__strlen_sse2", 0xa0b65))]
    assert {k["signature"] for k in keys} == {"app SIGSEGV strlen | count_name < main"}
    assert len({k["signature_id"] for k in keys}) == 1 and keys[0]["signature_id"].startswith("s2-")
    assert len({k["signature_v1_id"] for k in keys}) == 3
    assert all(k["signature_v1_id"].startswith("s1-") for k in keys)
    assert len({k["exact_key"] for k in keys}) == 3


@pytest.mark.parametrize("frames, expected", [
    # libc string/memory functions are a prefix: the caller and four more are counted after them
    ([libc("__strlen_evex"), fr("f1"), fr("f2"), fr("f3"), fr("f4"), fr("f5"), fr("f6")],
     ["strlen |", "f1", "f2", "f3", "f4", "f5"]),
    # several: the allocator's internals on the way down from free()
    ([libc("malloc_printerr"), libc("_int_free"), libc("free"), fr("release"), fr("main")],
     ["_int_free |", "free |", "release", "main"]),
    ([libc("__memmove_avx_unaligned_erms"), libc("__memcpy_chk"), fr("copy"), fr("main")],
     ["memmove |", "copy", "main"]),
    # the program's own function of a libc-like name is not a prefix: only libc's module is
    ([fr("strtok_mine", "/usr/bin/app"), fr("main")], ["strtok_mine", "main"]),
    # a stack of prefix frames only: the last one is the signature
    ([libc("malloc"), libc("_int_malloc")], ["malloc |", "_int_malloc"]),
    # at most PREFIX_FRAMES of them
    ([libc(f"_int_f{i}") for i in range(8)] + [fr("main")],
     [f"_int_f{i} |" for i in range(signature.PREFIX_FRAMES)] + ["main"]),
])
def test_v2_walks_past_libc_prefix_frames(frames, expected):
    assert signature.signature_frames(frames) == expected


def test_v2_prefix_reads_as_context():
    text = signature.signature("/usr/bin/app", "SIGABRT", [libc("raise"), libc("abort"), libc("malloc_printerr"),
                                                          libc("_int_free"), libc("free"), fr("release"), fr("main")])
    assert text == "app SIGABRT _int_free | free | release < main"


@pytest.mark.parametrize("frames, expected", [
    ([fr("crash"), fr("main"), libc("__libc_start_call_main"), libc("__libc_start_main_impl"), fr("_start")],
     ["crash", "main"]),
    ([fr("worker"), libc("start_thread"), libc("__clone3")], ["worker"]),
    ([fr("_start")], ["_start"]),
])
def test_v2_drops_start_and_thread_entry_frames(frames, expected):
    assert signature.signature_frames(frames) == expected


def test_v2_unsymbolised_frames_are_their_module_alone():
    """Two builds of one stripped program crashing in the same place: v1 spelled the offsets and split them,
    v2 names the module and keeps them together; the exact key still tells the builds apart."""
    start = libc("__libc_start_call_main")
    one = [fr(None, "/usr/bin/app", 0x11ae, "aa"), fr(None, "/usr/bin/app", 0x1226, "aa"), start]
    two = [fr(None, "/usr/bin/app", 0x12de, "bb"), fr(None, "/usr/bin/app", 0x1356, "bb"), start]
    a, b = (signature.keys("/usr/bin/app", bid, 11, "SIGSEGV", f) for bid, f in (("aa", one), ("bb", two)))
    assert a["signature"] == b["signature"] == "app SIGSEGV app"
    assert a["signature_v1_id"] != b["signature_v1_id"] and a["exact_key"] != b["exact_key"]
    assert signature.signature_frames([fr(None, "/usr/lib/libfoo.so.1", 0x42), fr("main")]) == ["libfoo.so.1", "main"]
    assert signature.signature_frames([fr(None, None, None, pc=0x7f0012345678)]) == ["?"]


@pytest.mark.parametrize("raw, expected", [
    ("core::panicking::panic_fmt::h0123456789abcdef", "core::panicking::panic_fmt"),
    ("app::parse::h00ff00ff00ff00ff", "app::parse"),
    ("app::Thing::hash", "app::Thing::hash"),
    ("ns::parse(char const*) [clone .cold]", "ns::parse"),
    ("ns::parse(char const*) [clone .isra.0] [clone .cold]", "ns::parse"),
])
def test_v2_normalises_rust_hashes_and_demangled_clones(raw, expected):
    assert signature.normalise_function(raw) == expected


def py(file, function, line=1):
    return {"file": file, "function": function, "line": line, "entry": False}


# The ctypes crash of tests/local/test_pyframes_real.py as the unwinder and pystack give it.
_CTYPES = [fr("__strlen_evex", "/usr/lib/x86_64-linux-gnu/libc.so.6"), fr(None, "/usr/lib/_ctypes.so"),
           fr(None, "/usr/lib/libffi.so.8"), fr("ffi_call", "/usr/lib/libffi.so.8"),
           fr("_PyEval_EvalFrameDefault", "/usr/bin/python3.11"), fr("Py_BytesMain", "/usr/bin/python3.11")]
_PYTHON = [py("/usr/lib/python3.11/ctypes/__init__.py", "string_at", 519), py("/srv/app/crash.py", "inner", 5),
           py("/srv/app/crash.py", "middle", 9), py("/srv/app/crash.py", "outer", 13),
           py("/srv/app/crash.py", "<module>", 16)]


def test_v2_python_frames_follow_the_native_crash_frame():
    """Rule 9: the native crash frame (after the prefix), then the innermost Python frames as file:function,
    in place of the interpreter's frames that every Python crash shares."""
    text = signature.signature("/usr/bin/python3.11", "SIGSEGV", _CTYPES, python=_PYTHON)
    assert text == ("python3.11 SIGSEGV strlen | _ctypes.so < ctypes/__init__.py:string_at < crash.py:inner < "
                    "crash.py:middle < crash.py:outer")
    assert signature.signature("/usr/bin/python3.11", "SIGSEGV", _CTYPES) == \
        "python3.11 SIGSEGV strlen | _ctypes.so < libffi.so.8 < ffi_call < _PyEval_EvalFrameDefault < Py_BytesMain"


def test_v2_python_frames_ignore_lines_and_where_the_code_lives():
    """The same code edited (other lines) and run from another checkout or venv: one signature."""
    moved = [dict(f, file=f["file"].replace("/srv/app", "/home/alice/venv/src"), line=f["line"] + 7)
             for f in _PYTHON]
    a = signature.keys("/usr/bin/python3.11", "b1", 11, "SIGSEGV", _CTYPES, python=_PYTHON)
    b = signature.keys("/usr/bin/python3.11", "b1", 11, "SIGSEGV", _CTYPES, python=moved)
    assert a["signature_id"] == b["signature_id"]
    other = [py("/srv/app/crash.py", "other")] + _PYTHON[1:]
    assert signature.keys("/usr/bin/python3.11", "b1", 11, "SIGSEGV", _CTYPES, python=other)["signature_id"] != \
        a["signature_id"]


def test_v2_python_frames_leave_the_exact_key_and_v1_alone():
    with_py = signature.keys("/usr/bin/python3.11", "b1", 11, "SIGSEGV", _CTYPES, python=_PYTHON)
    without = signature.keys("/usr/bin/python3.11", "b1", 11, "SIGSEGV", _CTYPES)
    assert with_py["exact_key"] == without["exact_key"]
    assert with_py["signature_v1_id"] == without["signature_v1_id"]
    assert with_py["signature_id"] != without["signature_id"]


def test_v2_python_recursion_collapses_and_names_are_cut():
    deep = [py("/a/r.py", "recurse")] * 50 + [py("/a/r.py", "<module>")]
    assert signature.signature_frames(_CTYPES[1:], python=deep) == ["_ctypes.so", "r.py:recurse", "r.py:<module>"]
    long = [py("/a/" + "x" * 300 + ".py", "f")]
    assert len(signature.signature_frames(_CTYPES[1:], python=long)[1]) == signature.MAX_FRAME_CHARS + 3
