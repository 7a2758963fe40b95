"""corehandler.strategy: telling a COREDUMP_USE_PIPE kernel from a stock one by its kallsyms."""

from __future__ import annotations

import pytest

from corehandler import strategy

STOCK = b"""\
ffffffff81000000 T _stext
ffffffff8175c1f0 T dump_emit
ffffffff81760000 t vmsplice_to_pipe
ffffffff81760100 T __x64_sys_vmsplice
ffffffffc0000000 t vmsplice_to_pipe_helper\t[some_module]
"""
PATCHED = STOCK.replace(b"t vmsplice_to_pipe\n", b"T vmsplice_to_pipe\n")
# With kptr_restrict the addresses read as zeros; the symbol and its type are still there.
PATCHED_RESTRICTED = b"0000000000000000 T dump_emit\n0000000000000000 T vmsplice_to_pipe\n"
LOOKALIKES = b"ffffffff81760000 T vmsplice_to_pipe_v2\nffffffff81760000 T __vmsplice_to_pipe\n"


@pytest.mark.parametrize("kallsyms,patched", [
    (STOCK, False),
    (b"ffffffff8175c1f0 T dump_emit\n", False),  # inlined away: not there at all
    (PATCHED, True),
    (PATCHED_RESTRICTED, True),
    (LOOKALIKES, False),
    (b"", False),
])
def test_kernel_kind_from_kallsyms(tmp_path, kallsyms, patched):
    (tmp_path / "kallsyms").write_bytes(kallsyms)
    assert strategy.kernel_vmsplices_cores(tmp_path) is patched
    expected = strategy.PATCHED_KERNEL_STRATEGY if patched else strategy.STOCK_KERNEL_STRATEGY
    assert strategy.choose_strategy(tmp_path) == expected


def test_unreadable_kallsyms_reads_as_stock(tmp_path):
    assert strategy.kernel_vmsplices_cores(tmp_path) is False  # no kallsyms at all
    (tmp_path / "kallsyms").mkdir()
    assert strategy.choose_strategy(tmp_path) == strategy.STOCK_KERNEL_STRATEGY


def test_choices_are_strategies_csplice_knows():
    assert strategy.STOCK_KERNEL_STRATEGY in strategy.STRATEGIES
    assert strategy.PATCHED_KERNEL_STRATEGY in strategy.STRATEGIES


def test_this_kernel(tmp_path):
    """The host's own kallsyms parses either way (this 6.18 build is a stock one)."""
    assert strategy.choose_strategy() in strategy.STRATEGIES
