"""``compat.patching.patched``: the one way dualexport swaps a library's module attribute while it
lowers (ExecuTorch's partition copy, XNNPACK's pass manager and batch-norm naming, torch's CIA
walk): re-entrant, shared across threads, restored by the last block to close."""

from __future__ import annotations

import threading
import types

import pytest

from dualexport.compat.patching import is_patched, patched


def _module() -> types.SimpleNamespace:
    return types.SimpleNamespace(fn=lambda: "library")


def test_nested_blocks_share_one_swap_and_the_last_restores() -> None:
    lib = _module()
    original = lib.fn
    made: list[object] = []

    def make(orig: object) -> object:
        made.append(orig)
        return lambda: "ours"

    with patched(lib, "fn", make) as seen:
        assert seen is original and lib.fn() == "ours" and is_patched(lib, "fn")
        swapped = lib.fn
        with patched(lib, "fn", make):
            assert lib.fn is swapped  # not wrapped twice
        assert lib.fn is swapped  # the inner block restored nothing
    assert lib.fn is original and not is_patched(lib, "fn")
    assert made == [original]


def test_an_exception_restores_the_original() -> None:
    lib = _module()
    original = lib.fn
    with pytest.raises(RuntimeError), patched(lib, "fn", lambda _: lambda: "ours"):
        raise RuntimeError("a lowering failed")
    assert lib.fn is original


def test_a_thread_still_inside_keeps_the_swap_another_thread_closed() -> None:
    lib = _module()
    original = lib.fn
    entered, release = threading.Event(), threading.Event()
    seen: list[str] = []

    def other() -> None:
        with patched(lib, "fn", lambda _: lambda: "ours"):
            entered.set()
            release.wait(5)
            seen.append(lib.fn())

    thread = threading.Thread(target=other)
    thread.start()
    entered.wait(5)
    with patched(lib, "fn", lambda _: lambda: "other"):
        assert lib.fn() == "ours"  # the open swap is shared, not replaced
    assert lib.fn() == "ours"  # this thread's block closed; the other thread's is still open
    release.set()
    thread.join(5)
    assert seen == ["ours"] and lib.fn is original


def test_the_lowering_swaps_are_in_force_only_inside_their_blocks() -> None:
    from dualexport.compat.executorch import (
        backend_api_module,
        batch_norm_pass_modules,
        xnnpack_preprocess_module,
    )
    from dualexport.exporters.backend_passes import pruned_backend_passes
    from dualexport.exporters.xnnpack_fixes import xnnpack_workarounds

    api, prep, bn = backend_api_module(), xnnpack_preprocess_module(), batch_norm_pass_modules()
    before = (api.copy, prep.XNNPACKPassManager, [m.create_constant_placeholder for m in bn])
    with xnnpack_workarounds(), pruned_backend_passes():
        assert api.copy is not before[0] and prep.XNNPACKPassManager is not before[1]
        assert all(m.create_constant_placeholder is not f for m, f in zip(bn, before[2], strict=True))
        with xnnpack_workarounds(share_weights=False):
            assert api.copy is not before[0]  # the outer block's swap stays
    assert (api.copy, prep.XNNPACKPassManager, [m.create_constant_placeholder for m in bn]) == before
