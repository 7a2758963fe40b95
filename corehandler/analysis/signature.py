"""The two grouping keys of a crash, pure functions of its analysed frames (docs/analysis.md, "Grouping keys").

exact key (EXACT_VERSION): the same build's same crash, on every host, without symbols. A hash of the
    exe's build-id, the signal and the crashing thread's top EXACT_FRAMES frames as module build-id + offset
    in the module (the return address minus one for every frame but the first, as the unwinder reports it).
signature (SIGNATURE_VERSION): the same bug, even in a rebuilt binary or on another CPU. Readable text
    `EXE SIGNAME [p1 | p2 | ]f1 < f2 < f3 ...`: the exe's file name, the signal's name, and the crashing
    thread's frames after leading noise is dropped (abort, raise, assert, __*_chk, ...: everything down to the
    last such frame among the top NOISE_DEPTH), each frame's function normalised (no __GI_ prefix, symbol
    version, argument list, clone suffix or Rust hash; libc's CPU-specific ifunc variants under their public
    name: __strlen_evex -> strlen), start and thread-entry frames dropped, consecutive repeats collapsed
    (recursion), unsymbolised frames as their module's file name alone, and for a Python crash the innermost
    Python frames (`file:function`) after the native crash frame. libc's string, memory and allocator
    functions on top are a prefix (Socorro's "prefix" list): kept as context, joined by ` | `, and the
    SIGNATURE_FRAMES frames counted from their caller. `signature_id` is its short hash, safe in a file name
    or an object key.
    Version 1 (`signature(..., version=1)`) spelled unsymbolised frames `module+0xOFFSET` and knew no ifunc, prefix or
    start rule; it is still computed, so a v2 group can be linked to the v1 group of the same dumps.

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
SIGNATURE_VERSION = 2
EXACT_FRAMES = 8
SIGNATURE_FRAMES = 5
PREFIX_FRAMES = 4
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
                   re.compile(r"^_Unwind_\w+$"), re.compile(r"^(?:str|mem|stp|wcs|wmem|wcp)\w*_chk$"))
# Where every thread begins: they say nothing of the crash (satyr drops them too). Version 2.
START = frozenset({"_start", "__libc_start_main", "__libc_start_main_impl", "__libc_start_call_main",
                   "start_thread", "clone", "clone3", "__clone", "__clone3", "__clone_internal", "thread_start"})
_VERSION = re.compile(r"@@?[A-Za-z0-9_.]+$")
_CLONE = re.compile(r"(\.(isra|constprop|part|cold|lto_priv|llvm|clone|localalias|specialized)(\.\d+)?)+$")
# Version 2: what demanglers add after the name (` [clone .cold]`) and Rust's legacy symbol hash (`::h` + 16 hex).
_DEMANGLED_CLONE = re.compile(r"(\s*\[clone \.[\w.]+\])+$")
_RUST_HASH = re.compile(r"::h[0-9a-f]{16}$")

# glibc's ifunc variants: `__NAME_VARIANT`, where VARIANT is words naming a CPU feature or an implementation
# choice (sysdeps/x86_64/multiarch, sysdeps/aarch64/multiarch, powerpc's power7...). The rule is the shape,
# not a list of names, so the next CPU's variant folds too; the name is kept only when the words after it are
# all such words, so `__libc_start_main` or `__strlen_helper` stay themselves.
_IFUNC_WORDS = (r"(?:sse2|sse3|ssse3|sse4|sse4_1|sse4_2|sse42|avx|avx2|avx512|avx512f|avx512bw|avx512vl|evex|"
                r"evex512|erms|rtm|fsrm|unaligned|aligned|vzeroupper|no_vzeroupper|back|bsf|pminub|nocona|"
                r"atom|slm|x86_64|ia32|generic|simd|asimd|nosimd|sve|mte|mops|zva|zva64|kunpeng|thunderx|"
                r"thunderx2|falkor|a64fx|emag|oryon1|power\d+|ppc|vsx|z900|z13|z15|arch13|vx|c|i386|i586|i686|movbe)")
_IFUNC = re.compile(rf"^__(?P<name>[a-z][a-z0-9]*(?:_[a-z0-9]+)*?)(?:_{_IFUNC_WORDS})+$")
# Only these families are CPU-dispatched; the name must be one of them for the fold to apply.
_DISPATCHED = re.compile(r"^(?:str|mem|wcs|wmem|stp|wcp|rawmem|raw)\w*$")
# glibc's variants give memcpy and memmove one body at one address (x86_64, aarch64): which of the two names
# the unwinder reads there differs per variant and per build, so a variant of either is memmove.
_ALIASES = {"memcpy": "memmove"}
# libc's string, memory and allocator functions (after folding): a crash in them is its caller's bug.
_PREFIX = re.compile(r"^(?:(?:str|mem|wcs|wmem|stp|wcp|rawmem)\w*|__(?:str|mem|wcs|stp)\w*|"
                     r"malloc|free|calloc|realloc|reallocarray|cfree|valloc|pvalloc|memalign|aligned_alloc|"
                     r"posix_memalign|__libc_\w*(?:alloc|free|memalign)|_int_\w+|malloc_consolidate|"
                     r"unlink_chunk|tcache_\w+|sysmalloc|_mid_memalign|"
                     r"operator new|operator delete|operator new\[\]|operator delete\[\])$")
_LIBC = re.compile(r"^(?:libc[.-]|ld-musl|libc\.musl|libstdc\+\+)")


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


def normalise_function(name: str, version: int = SIGNATURE_VERSION) -> str:
    name = _VERSION.sub("", name.strip())
    if version >= 2:
        name = _DEMANGLED_CLONE.sub("", name)
    name = strip_arguments(name)
    name = _CLONE.sub("", name)
    if name.startswith("__GI_"):  # glibc's internal aliases: __GI_raise, __GI___assert_fail
        name = name[len("__GI_"):]
    if version >= 2:
        name = fold_ifunc(_RUST_HASH.sub("", name))
    return name


def fold_ifunc(name: str) -> str:
    """`__strlen_evex`, `__strlen_avx2`, `__strlen_sse2` -> `strlen`; `__memmove_avx_unaligned_erms` ->
    `memmove`; `__memcpy_generic` (aarch64) -> `memmove`; any other name as it is."""
    m = _IFUNC.match(name)
    if m and _DISPATCHED.match(m.group("name")):
        return _ALIASES.get(m.group("name"), m.group("name"))
    return name


def is_noise(function: str) -> bool:
    return function in NOISE or any(p.match(function) for p in _NOISE_PATTERNS)


def _module_name(frame: Mapping[str, Any]) -> str:
    module = frame.get("module")
    return os.path.basename(module) if module else "?"


def is_prefix(frame: Mapping[str, Any], text: str) -> bool:
    """A libc string, memory or allocator function (libstdc++'s operator new/delete too), in libc's module
    or one the unwinder could not name: the signature walks past it to its caller."""
    module = frame.get("module")
    return bool(frame.get("function")) and bool(_PREFIX.match(text)) and \
        (not module or bool(_LIBC.match(os.path.basename(module))))


def frame_text(frame: Mapping[str, Any], version: int = SIGNATURE_VERSION) -> str:
    """A frame as the signature spells it: its normalised function, else (version 2) its module's file name
    alone, as the offset changes with every build; version 1 spelled it module+0xOFFSET (the pc alone when
    no module maps it)."""
    function = frame.get("function")
    if function:
        text = normalise_function(function, version)
    elif version >= 2:
        text = _module_name(frame)
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


def _collapsed(texts: Iterable[str]) -> list[str]:
    out: list[str] = []
    for t in texts:
        if not out or out[-1] != t:
            out.append(t)
    return out


def python_frame_text(frame: Mapping[str, Any]) -> str:
    """A Python frame as the signature spells it (rule 9): `file:function`, the file by its name alone (a
    package's `__init__.py`/`__main__.py` with its directory), so the same code crashes alike from any venv,
    checkout or interpreter's prefix; the line, which moves with every edit, is left out."""
    parts = str(frame.get("file") or "?").split("/")
    name = "/".join(parts[-2:]) if parts[-1] in ("__init__.py", "__main__.py") and len(parts) > 1 else parts[-1]
    text = f"{name}:{frame.get('function') or '?'}"
    return text if len(text) <= MAX_FRAME_CHARS else text[:MAX_FRAME_CHARS] + "..."


def signature_frames(frames: Sequence[Mapping[str, Any]], count: int = SIGNATURE_FRAMES,
                     version: int = SIGNATURE_VERSION, python: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """The signature's frames, innermost first; in version 2 the libc prefix frames come first, each ending
    in ` |` (so the text reads `strlen | caller < main`). `python`: the crashing thread's Python frames,
    innermost first (pyframes.py): in version 2 they follow the native crash frame, in place of the
    interpreter's own frames, which every Python crash shares."""
    texts = [frame_text(f, version) for f in frames]
    start = _start(frames, texts)
    if version < 2:
        return _collapsed(texts[start:])[:count]
    kept = [(f, t) for f, t in zip(frames[start:], texts[start:]) if not (f.get("function") and t in START)]
    if not kept and start < len(frames):  # only start frames: the innermost stays, a signature is never empty
        kept = [(frames[start], texts[start])]
    # Noise between the prefix frames (a __memcpy_chk under memmove) is walked past as well, unshown.
    prefix = 0
    while prefix < len(kept) - 1 and is_prefix(*kept[prefix]):
        prefix += 1
    head = _collapsed(t for f, t in kept[:prefix] if not is_noise(t))[:PREFIX_FRAMES]
    rest = _collapsed(t for _, t in kept[prefix:])
    if python:
        rest = rest[:1] + _collapsed(python_frame_text(f) for f in python)
    return [f"{t} |" for t in head] + rest[:count]


def _join(parts: list[str]) -> str:
    text = ""
    for part in parts:
        text += part + (" " if part.endswith(" |") else " < ")
    return text.removesuffix(" < ")


def signature(exe: str | None, signal_name: str | None, frames: Sequence[Mapping[str, Any]],
              version: int = SIGNATURE_VERSION, python: Sequence[Mapping[str, Any]] = ()) -> str:
    name = os.path.basename(exe.removesuffix(" (deleted)")) if exe else "?"
    parts = signature_frames(frames, version=version, python=python if version >= 2 else ())
    return f"{name} {signal_name or '?'} " + (_join(parts) if parts else "(no frames)")


def signature_id(text: str, version: int = SIGNATURE_VERSION) -> str:
    return f"s{version}-" + hashlib.sha256(f"{version}\n{text}".encode(
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
         frames: Sequence[Mapping[str, Any]], python: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Both keys of a crashing thread's frames (and its Python frames, if any), as the analysis row stores
    them, and the version 1 signature's id (`signature_v1_id`): what hosts and dumps of before version 2 group
    by, so the two can be linked. The exact key is the native frames' alone."""
    text = signature(exe, signal_name, frames, python=python)
    return {"signature": text, "signature_id": signature_id(text), "signature_version": SIGNATURE_VERSION,
            "signature_v1_id": signature_id(signature(exe, signal_name, frames, 1), 1),
            "exact_key": exact_key(exe_build_id, signal, frames), "exact_version": EXACT_VERSION}
