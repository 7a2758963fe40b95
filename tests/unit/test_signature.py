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
def test_signature_frames(frames, expected):
    assert signature.signature_frames(frames) == expected


def test_signature_text_names_exe_and_signal():
    text = signature.signature("/usr/bin/app (deleted)", "SIGSEGV", [fr("crash"), fr("main")])
    assert text == "app SIGSEGV crash < main"
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
