"""The two grouping keys of a crash, pure functions of its analysed frames (docs/analysis.md, "Grouping keys").

exact key (EXACT_VERSION): the same build's same crash, on every host, without symbols. A hash of the
    exe's build-id, the signal and the crashing thread's top EXACT_FRAMES frames as module build-id + offset
    in the module (the return address minus one for every frame but the first, as the unwinder reports it).
signature (SIGNATURE_VERSION): the same bug, even in a rebuilt binary. Readable text
    `EXE SIGNAME f1 < f2 < f3 ...`: the exe's file name, the signal's name, and the top SIGNATURE_FRAMES
    frames of the crashing thread after leading noise is dropped (when the top frame is abort, raise,
    assert, __*_chk, ...: everything down to the last such frame among the top NOISE_DEPTH), each
    frame's function normalised (no __GI_ prefix, symbol version, argument list or clone suffix),
    consecutive repeats collapsed into one (recursion), unsymbolised frames as `module+0xOFFSET`.
    `signature_id` is its short hash, safe in a file name or an object key.

A change to either formula must bump its version: the version is part of the hashed text and of the key,
so keys of two formulas never compare equal.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

EXACT_VERSION = 1
SIGNATURE_VERSION = 1
EXACT_FRAMES = 8
SIGNATURE_FRAMES = 5
MAX_FRAME_CHARS = 200
NOISE_DEPTH = 16

# Functions that are how a process dies, not where it went wrong: dropped from the top of the stack.
NOISE = frozenset({
    "raise", "abort", "gsignal", "kill", "pthread_kill", "tgkill", "__pthread_kill_implementation",
    "__pthread_kill_internal", "__pthread_kill", "__restore_rt",
    "__assert_fail", "__assert_fail_base", "__assert_perror_fail", "__assert", "__assert_rtn",
    "__libc_message", "__libc_fatal", "__fortify_fail", "__fortify_fail_abort", "__chk_fail",
    "__stack_chk_fail", "__stack_chk_fail_local", "malloc_printerr", "__malloc_assert", "__libc_assert_fail",
    "std::terminate", "std::__terminate", "__cxxabiv1::__terminate", "__cxa_throw", "__cxa_rethrow",
    "__cxa_call_terminate", "__cxa_call_unexpected", "__cxa_pure_virtual", "std::rethrow_exception",
    "__gnu_cxx::__verbose_terminate_handler", "_Unwind_Resume", "_Unwind_RaiseException",
    "g_assertion_message", "g_assertion_message_expr", "g_log", "g_logv", "g_error",
})
_NOISE_PATTERNS = (re.compile(r"^__\w+_chk$"), re.compile(r"^std::__throw_\w+$"),
                   re.compile(r"^_Unwind_\w+$"))
_VERSION = re.compile(r"@@?[A-Za-z0-9_.]+$")
_CLONE = re.compile(r"(\.(isra|constprop|part|cold|lto_priv|llvm|clone|localalias|specialized)(\.\d+)?)+$")


def strip_arguments(name: str) -> str:
    """`ns::f(int, char const*) const` -> `ns::f`: the last balanced parenthesised group at the end goes,
    with the qualifiers after it. Parentheses inside the name ("(anonymous namespace)") stay."""
    s = re.sub(r"(\s*(const|volatile|&&|&|noexcept))+$", "", name.rstrip())
    if not s.endswith(")"):
        return name
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:
                head = s[:i].rstrip()
                return head if head and not head.endswith("::") else name
    return name


def normalise_function(name: str) -> str:
    name = _VERSION.sub("", name.strip())
    name = strip_arguments(name)
    name = _CLONE.sub("", name)
    if name.startswith("__GI_"):  # glibc's internal aliases: __GI_raise, __GI___assert_fail
        name = name[len("__GI_"):]
    return name


def is_noise(function: str) -> bool:
    return function in NOISE or any(p.match(function) for p in _NOISE_PATTERNS)


def _module_name(frame: Mapping[str, Any]) -> str:
    module = frame.get("module")
    return os.path.basename(module) if module else "?"


def frame_text(frame: Mapping[str, Any]) -> str:
    """A frame as the signature spells it: its normalised function, else module+0xOFFSET (the pc alone when
    no module maps it)."""
    function = frame.get("function")
    if function:
        text = normalise_function(function)
    elif frame.get("offset") is not None:
        text = f"{_module_name(frame)}+{frame['offset']:#x}"
    else:
        text = f"{frame.get('pc', 0):#x}"
    return text if len(text) <= MAX_FRAME_CHARS else text[:MAX_FRAME_CHARS] + "..."


def _start(frames: Sequence[Mapping[str, Any]], texts: list[str]) -> int:
    """Where the signature starts: past the last noise frame among the top NOISE_DEPTH, when the stack starts
    with noise (raise < abort < [unsymbolised libstdc++ frames] < std::terminate < __cxa_throw < f: f)."""
    def noise(i: int) -> bool:
        return bool(frames[i].get("function")) and is_noise(texts[i])
    if not texts or not noise(0):
        return 0
    last = max(i for i in range(min(len(texts), NOISE_DEPTH)) if noise(i))
    return min(last + 1, len(texts) - 1)


def signature_frames(frames: Sequence[Mapping[str, Any]], count: int = SIGNATURE_FRAMES) -> list[str]:
    texts = [frame_text(f) for f in frames]
    start = _start(frames, texts)
    out: list[str] = []
    for t in texts[start:]:
        if out and out[-1] == t:
            continue
        out.append(t)
        if len(out) == count:
            break
    return out


def signature(exe: str | None, signal_name: str | None, frames: Sequence[Mapping[str, Any]]) -> str:
    name = os.path.basename(exe.removesuffix(" (deleted)")) if exe else "?"
    parts = signature_frames(frames)
    return f"{name} {signal_name or '?'} " + (" < ".join(parts) if parts else "(no frames)")


def signature_id(text: str) -> str:
    return f"s{SIGNATURE_VERSION}-" + hashlib.sha256(f"{SIGNATURE_VERSION}\n{text}".encode(
        "utf-8", "surrogateescape")).hexdigest()[:16]


def _exact_frame(frame: Mapping[str, Any]) -> str:
    if frame.get("offset") is None:
        return f"?+{frame.get('pc', 0):#x}"
    return f"{frame.get('build_id') or _module_name(frame)}+{frame['offset']:#x}"


def exact_key(exe_build_id: str | None, signal: int | None, frames: Iterable[Mapping[str, Any]]) -> str:
    top = [_exact_frame(f) for f, _ in zip(frames, range(EXACT_FRAMES))]
    text = "\n".join([str(EXACT_VERSION), exe_build_id or "-", str(signal)] + top)
    return f"x{EXACT_VERSION}-" + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def keys(exe: str | None, exe_build_id: str | None, signal: int | None, signal_name: str | None,
         frames: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Both keys of a crashing thread's frames, as the analysis row stores them."""
    text = signature(exe, signal_name, frames)
    return {"signature": text, "signature_id": signature_id(text), "signature_version": SIGNATURE_VERSION,
            "exact_key": exact_key(exe_build_id, signal, frames), "exact_version": EXACT_VERSION}
