"""attention backward, BWD_DS_STORE: the dk/dv kernel stores dS and dq is one chain of dots of the stored dS and K.
It has the two-kernel path's bits (dq, dk, dv) with all KV heads in one launch, in groups (the workspace budget) and
past the budget (the dq kernel takes over); a planted order change in its chain is seen; a candidate with it passes
the contract's gradient checks; on the H200, the same at real shapes."""

from __future__ import annotations

import pytest
import torch
from test_attention_bwd import SOURCE, _case, _order_sensitive_case, _planted

from tik_kernels.contract import load_module, same_bits


def _grads(A, fwd, q, k, v, go, ds_store: int, block_n: int, monkeypatch) -> tuple:
    """dq, dk, dv with BWD_DS_STORE = ds_store (its dk/dv key tile block_n), else the dq kernel (key tile 64)."""
    monkeypatch.setitem(A.CONFIG, "BWD_DS_STORE", ds_store)
    monkeypatch.setitem(A.CONFIG, "DS_DKDV_BLOCK_N", block_n)
    monkeypatch.setitem(A.CONFIG, "DKDV_BLOCK_N", 64)
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    fwd(qq, kk, vv).backward(go)
    return qq.grad, kk.grad, vv.grad


def _head_bytes(A, fwd, q, k, v, go, monkeypatch) -> int:
    """The workspace one KV head takes for this case (from a plan with all heads in one launch)."""
    seen = []
    plan = A._ds_plan

    def spy(*args):
        got = plan(*args)
        seen.append(got)
        return got

    monkeypatch.setattr(A, "_ds_plan", spy)
    _grads(A, fwd, q, k, v, go, 1, 64, monkeypatch)
    monkeypatch.setattr(A, "_ds_plan", plan)
    ds, _, _, hc = seen[-1]
    assert hc == k.shape[-2 if k.dim() == 3 else 1], "the default budget holds every KV head of a test case"
    return ds.numel() // hc * ds.element_size()


@pytest.mark.parametrize("layout", ["dense", "packed", "many"])
def test_ds_store_has_the_two_kernel_bits(layout, monkeypatch):
    """dq, dk, dv bit for bit equal with and without BWD_DS_STORE: key tiles of one and two dq blocks; every KV
    head in one launch, one head per launch (a budget of one head's workspace) and no workspace at all (a budget
    below one head: the dq kernel computes dq); two seeds (one for the 12 packed sequences of 1 to 29)."""
    import tik_kernels.ops.attention as A

    default = A.DS_STORE_MAX_BYTES
    for seed in (0,) if layout == "many" else (0, 1):
        fwd, q, k, v, go = _case(A, layout, seed)
        want = _grads(A, fwd, q, k, v, go, 0, 64, monkeypatch)
        monkeypatch.setattr(A, "DS_STORE_MAX_BYTES", default)
        one_head = _head_bytes(A, fwd, q, k, v, go, monkeypatch)
        for budget, heads in ((default, 2), (one_head, 1), (one_head - 1, None)):
            monkeypatch.setattr(A, "DS_STORE_MAX_BYTES", budget)
            plan = A._ds_plan(q, *_plan_args(A, layout, q, k))
            assert (plan[3] if plan else None) == heads, (budget, plan and plan[3])
            for block_n in (64, 128):
                got = _grads(A, fwd, q, k, v, go, 1, block_n, monkeypatch)
                for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
                    assert same_bits(a, b), f"{layout} seed {seed} heads {heads} DKDV_BLOCK_N {block_n}: {name}"


def _plan_args(A, layout, q, k):
    """`_ds_plan`'s arguments after q for one of `_case`'s inputs, as `_bwd` passes them."""
    G = q.shape[-2 if layout != "dense" else 1] // k.shape[-2 if layout != "dense" else 1]
    hk = k.shape[-2 if layout != "dense" else 1]
    sub, tm = A._tiles()["DQ_BLOCK_N"], A._tiles()["DKDV_BLOCK_M"]
    if layout == "dense":
        cu = torch.zeros(1, dtype=torch.int32)
        return cu, q.shape[0], q.shape[2], q.shape[2], G, hk, sub, tm, 2 * sub, 0, False
    lens = [3, 21, 10] if layout == "packed" else [1 + (7 * i) % 30 for i in range(12)]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return cu, len(lens), max(lens), 0, G, hk, sub, tm, 2 * sub, 0, True


def test_ds_store_planted_order_change_is_seen(tmp_path, monkeypatch):
    """On the order-sensitive case, BWD_DS_STORE keeps the two-kernel bits, and a planted chain that walks a row
    tile's masked steps (its diagonal blocks; all of them in a sequence's last tile) last to first changes dq (dk
    and dv keep theirs)."""
    import tik_kernels.ops.attention as A

    fwd, q, k, v, go = _order_sensitive_case(A)
    want = _grads(A, fwd, q, k, v, go, 0, 64, monkeypatch)
    got = _grads(A, fwd, q, k, v, go, 1, 64, monkeypatch)
    assert all(same_bits(a, b) for a, b in zip(got, want, strict=True))
    bad = _planted(tmp_path, "ds_reversed",
                   ("    for j in range(n_full, tl.cdiv(pos_hi, SUB)):\n",
                    "    for jj in range(n_full, tl.cdiv(pos_hi, SUB)):\n"
                    "        j = tl.cdiv(pos_hi, SUB) - 1 - jj + n_full\n"))
    got = _grads(bad, bad.attention_prefill, q, k, v, go, 1, 64, monkeypatch)
    assert same_bits(got[1], want[1]) and same_bits(got[2], want[2])
    assert not same_bits(got[0], want[0]), "a reversed chain over the stored dS blocks not seen"


def test_ds_store_rejects_a_key_tile_that_is_not_one_or_two_dq_blocks(monkeypatch):
    import tik_kernels.ops.attention as A

    fwd, q, k, v, go = _case(A, "dense", 0)
    monkeypatch.setitem(A.CONFIG, "DQ_BLOCK_N", 16)
    with pytest.raises(ValueError, match="DS_DKDV_BLOCK_N"):
        _grads(A, fwd, q, k, v, go, 1, 64, monkeypatch)


def test_ds_store_is_used_only_where_it_fills_the_gpu_and_fits(monkeypatch):
    """The root stores dS on the interpreter's small shapes (DS_MIN_PROGRAMS is 0 there); a launch with fewer dk/dv
    programs than DS_MIN_PROGRAMS, a budget of 0 (TIK_ATTN_DS_MAX_BYTES=0) and a workspace the allocator cannot give
    keep the dq kernel; the bits are the same every way; a malformed TIK_ATTN_DS_MAX_BYTES is a clear error."""
    import tik_kernels.ops.attention as A

    fwd, q, k, v, go = _case(A, "packed", 4)
    calls = []
    plan = A._ds_plan
    monkeypatch.setattr(A, "_ds_plan", lambda *a: calls.append(plan(*a)) or calls[-1])
    kernel = A._attn_bwd_dq_ds_kernel
    used = []

    class Spy:
        def __getitem__(self, grid):
            used.append(grid)
            return kernel[grid]

    monkeypatch.setattr(A, "_attn_bwd_dq_ds_kernel", Spy())
    want = _grads(A, fwd, q, k, v, go, 0, 64, monkeypatch)
    assert not used
    got = _grads(A, fwd, q, k, v, go, 1, 64, monkeypatch)
    assert len(used) == 1 and calls[-1] is not None
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert same_bits(a, b), f"stored dS: {name}"
    orig = A._tiles
    monkeypatch.setattr(A, "_tiles", lambda: {**orig(), "DS_MIN_PROGRAMS": 10**6})
    got = _grads(A, fwd, q, k, v, go, 1, 64, monkeypatch)
    assert len(used) == 1 and calls[-1] is None, "a launch below DS_MIN_PROGRAMS stored dS"
    monkeypatch.setattr(A, "_tiles", orig)
    monkeypatch.setenv("TIK_ATTN_DS_MAX_BYTES", "0")
    got = _grads(A, fwd, q, k, v, go, 1, 64, monkeypatch)
    assert len(used) == 1 and calls[-1] is None, "a budget of 0 bytes stored dS"
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert same_bits(a, b), f"dq kernel under BWD_DS_STORE: {name}"
    monkeypatch.delenv("TIK_ATTN_DS_MAX_BYTES")

    def no_memory(*_):
        raise torch.OutOfMemoryError("no memory for dS")

    monkeypatch.setattr(A, "_ds_alloc", no_memory)
    got = _grads(A, fwd, q, k, v, go, 1, 64, monkeypatch)
    assert len(used) == 1 and calls[-1] is None, "an allocation that failed still stored dS"
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert same_bits(a, b), f"dq kernel after an out-of-memory workspace: {name}"
    monkeypatch.setenv("TIK_ATTN_DS_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="TIK_ATTN_DS_MAX_BYTES"):
        _grads(A, fwd, q, k, v, go, 1, 64, monkeypatch)


def test_dq_kernel_candidate_passes_the_contracts_gradient_checks_with_the_roots_bits(tmp_path):
    """The root stores dS; a candidate whose CONFIG turns that off (the dq kernel recomputes dS), as the tuner writes
    it: every gradient check of the contract's CPU plan passes, root_bits of the dense and packed backward
    included."""
    from test_attention import CONTRACT, run_checks

    cand = _planted(tmp_path, "dq_kernel_candidate", ('"BWD_DS_STORE": 1,', '"BWD_DS_STORE": 0,'))
    root = load_module(SOURCE, "attention_root_ds")
    results = run_checks(CONTRACT.plan("cpu", 0), cand, root, select=lambda n: "grad" in n or "backward" in n)
    bad = {n: r.detail for n, r in results.items() if not r.passed}
    assert not bad, bad
    assert sum(r.requirement == "root_bits" for r in results.values()) == 4


@pytest.mark.gpu
@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("layout", ["dense", "packed", "many"])
def test_gpu_ds_store_bits_and_determinism(layout, block_n, monkeypatch):
    """On the H200 (B=1 S=4096 Hq=32 Hk=8 D=128 bf16; packed 700 + 2300 + 50; 40 packed sequences of 1 to 298):
    BWD_DS_STORE's dq, dk, dv are deterministic and equal to the two-kernel path's, with every KV head in one
    launch and with one head per launch."""
    import tik_kernels.ops.attention as A

    fwd, q, k, v, go = _case(A, layout, 5, device="cuda", big=True)
    want = _grads(A, fwd, q, k, v, go, 0, block_n, monkeypatch)
    got = _grads(A, fwd, q, k, v, go, 1, block_n, monkeypatch)
    again = _grads(A, fwd, q, k, v, go, 1, block_n, monkeypatch)
    monkeypatch.setattr(A, "DS_STORE_MAX_BYTES", _head_bytes(A, fwd, q, k, v, go, monkeypatch))
    grouped = _grads(A, fwd, q, k, v, go, 1, block_n, monkeypatch)
    torch.cuda.synchronize()
    assert all(same_bits(a, b) for a, b in zip(got, again, strict=True)), "BWD_DS_STORE not deterministic"
    for name, a, b, c in zip(("dq", "dk", "dv"), got, want, grouped, strict=True):
        assert same_bits(a, b), f"BWD_DS_STORE {name} differs from the two-kernel path"
        assert same_bits(c, b), f"BWD_DS_STORE one KV head per launch: {name} differs"


def test_ds_plan_reads_nothing_back_from_the_device(monkeypatch):
    """Everything the stored-dS path decides is known on the host: its plan never reads a tensor's value (a read
    waits for the device and breaks CUDA-graph capture; a first version did, and its benchmark silently timed the
    backward eagerly). Dense and packed, with the bits checked too."""
    import tik_kernels.ops.attention as A

    plan = A._ds_plan

    def strict(*args):
        def refuse(*_a, **_k):
            raise AssertionError("the stored-dS plan read a tensor's value on the host")

        with monkeypatch.context() as m:
            for name in ("item", "tolist", "__int__", "__float__", "__bool__", "__index__", "numpy"):
                m.setattr(torch.Tensor, name, refuse)
            return plan(*args)

    monkeypatch.setattr(A, "_ds_plan", strict)
    for layout in ("dense", "packed"):
        fwd, q, k, v, go = _case(A, layout, 6)
        want = _grads(A, fwd, q, k, v, go, 0, 64, monkeypatch)
        got = _grads(A, fwd, q, k, v, go, 1, 64, monkeypatch)
        for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
            assert same_bits(a, b), f"{layout}: {name}"


def test_ds_region_starts_are_computed_once_per_cu():
    """The packed regions' starts come from cu on the device (a dozen small launches a layer); every layer of a
    backward passes the same cu, so the first layer's starts serve the rest: the same tensor for the same cu, new
    ones once cu changes in place (its version moves) or for another cu, each equal to a fresh computation."""
    import tik_kernels.ops.attention as A

    G, tm, sub, hc = 2, 16, 16, 2
    tiles = A._ds_tile_starts(8, tm, G, sub, torch.device("cpu"))

    def starts(cu, fresh=False):
        if fresh:
            A._DS_BASES.clear()
        return A._ds_region_starts(cu, tiles, cu.numel() - 1, G, tm, hc, 4096, True, torch.device("cpu"))

    cu = torch.tensor([0, 3, 24, 34], dtype=torch.int32)
    first = starts(cu, fresh=True)
    assert starts(cu) is first
    assert starts(cu[:]) is first  # a view of the same storage, as autograd's saved copy is
    other = torch.tensor([0, 3, 24, 34], dtype=torch.int32)
    assert torch.equal(starts(other), first)
    cu[2] = 30  # in place: the version moves, the starts are computed again
    moved = starts(cu)
    assert moved is not first and torch.equal(moved, starts(cu.clone(), fresh=True))
    assert not torch.equal(moved, first)
