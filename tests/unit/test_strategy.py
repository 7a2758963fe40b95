"""corehandler.csplice_contract: telling a COREDUMP_USE_PIPE kernel from a stock one by its kallsyms, and what
`strategy = "auto"` then renders into csplice.conf. (That csplice knows every name: test_csplice_contract.py.)"""

from __future__ import annotations

import pytest

from corehandler import config, csplice_contract
from corehandler.host import handler
from corehandler.paths import Host, Paths

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


def rendered_strategy(proc_root, capture: dict | None = None) -> str:
    cfg = config.Config.model_validate({"capture": capture or {}})
    paths = Paths(state_dir=proc_root / "state")
    facts = handler.facts(Host(proc_root=proc_root), paths)
    return csplice_contract.settings_values(cfg.capture, paths.spool_dir, facts)["strategy"]


@pytest.mark.parametrize("kallsyms,patched", [
    (STOCK, False),
    (b"ffffffff8175c1f0 T dump_emit\n", False),  # inlined away: not there at all
    (PATCHED, True),
    (PATCHED_RESTRICTED, True),
    (LOOKALIKES, False),
    (b"", False),
])
def test_auto_follows_the_kind_of_kernel(tmp_path, kallsyms, patched):
    """A patched kernel vmsplices the process's own pages into the pipe, so a splicing handler copies them
    never; on a stock kernel the pipe holds the kernel's copy and read/write measured best."""
    (tmp_path / "kallsyms").write_bytes(kallsyms)
    assert csplice_contract.kernel_vmsplices_cores(tmp_path) is patched
    chosen = rendered_strategy(tmp_path)
    assert chosen.startswith("splice") is patched, chosen


def test_a_configured_strategy_is_not_second_guessed(tmp_path):
    (tmp_path / "kallsyms").write_bytes(PATCHED)
    assert rendered_strategy(tmp_path, {"strategy": "rw2"}) == "rw2"
    assert rendered_strategy(tmp_path).startswith("splice")


def test_unreadable_kallsyms_reads_as_stock(tmp_path):
    """Unreadable reads as stock: the stock choice is never slow on a patched kernel, the reverse can be."""
    assert csplice_contract.kernel_vmsplices_cores(tmp_path) is False  # no kallsyms at all
    (tmp_path / "kallsyms").mkdir()
    assert csplice_contract.kernel_vmsplices_cores(tmp_path) is False
    assert not rendered_strategy(tmp_path).startswith("splice")
