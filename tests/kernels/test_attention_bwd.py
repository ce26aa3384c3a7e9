"""attention backward, BWD_DQ_FUSED: dq computed inside the dk/dv kernel, each row tile's KV blocks added in key
order through per-tile turn counters, has the two-kernel path's bits (dq, dk, dv); planted order changes are
seen; the fused kernel compiles for sm_90 with its acquire/release atomics; on the H200, the same at real shapes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tik_kernels.contract import load_module, same_bits

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tik_kernels" / "ops" / "attention.py"


def _grads(A, fwd, q, k, v, go, fused: int, block_n: int, monkeypatch) -> tuple:
    """dq, dk, dv of <fwd(q, k, v), go> with BWD_DQ_FUSED = fused and DKDV_BLOCK_N = block_n (without fusion: the
    dq kernel, BWD_DS_STORE off; tests/kernels/test_attention_ds.py has the stored-dS path)."""
    monkeypatch.setitem(A.CONFIG, "BWD_DS_STORE", 0)
    monkeypatch.setitem(A.CONFIG, "BWD_DQ_FUSED", fused)
    monkeypatch.setitem(A.CONFIG, "DKDV_BLOCK_N", block_n)
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    fwd(qq, kk, vv).backward(go)
    return qq.grad, kk.grad, vv.grad


def _case(A, layout: str, seed: int, device: str = "cpu", big: bool = False):
    """(fwd, q, k, v, dO): dense [B, Hq, S, D] with GQA and S off the block grid, or packed sequences of unequal
    lengths, one shorter than a KV block (4 keys in the interpreter, 64 on the GPU), or 40 short ones ("many")."""
    gen = torch.Generator(device=device).manual_seed(seed)
    Hq, Hk, D = (32, 8, 128) if big else (4, 2, 16)

    def r(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(torch.bfloat16)

    if layout in ("packed", "many"):
        lens = [700, 2300, 50] if big else [3, 21, 10]
        if layout == "many":  # most key-block programs are past their sequence's end
            lens = [1 + (37 * i) % 300 for i in range(40)] if big else [1 + (7 * i) % 30 for i in range(12)]
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
        T = sum(lens)
        q, k, v, go = r(T, Hq, D), r(T, Hk, D), r(T, Hk, D), r(T, Hq, D)

        def fwd(q, k, v):
            return A.attention_varlen(q, k, v, cu, max_seqlen=max(lens))
    else:
        B, S = (1, 4096) if big else (2, 19)
        q, k, v, go = r(B, Hq, S, D), r(B, Hk, S, D), r(B, Hk, S, D), r(B, Hq, S, D)
        fwd = A.attention_prefill
    return fwd, q, k, v, go


def _launch_keeps_bits(A, fwd, q, k, v, go, label: str, monkeypatch, **launch) -> None:
    """The output of fwd(q, k, v) and dq, dk, dv of <fwd, go> are bit for bit the CONFIG's with the launch choices
    `launch` set too."""
    want_o = fwd(q, k, v)
    want = _grads(A, fwd, q, k, v, go, 0, 64, monkeypatch)
    for key, value in launch.items():
        monkeypatch.setitem(A.CONFIG, key, value)
    assert same_bits(fwd(q, k, v), want_o), f"{label}: the output differs"
    got = _grads(A, fwd, q, k, v, go, 0, 64, monkeypatch)
    for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert same_bits(a, b), f"{label}: {name} differs"


def _planted(tmp_path: Path, name: str, *changes: tuple[str, str]):
    """attention.py with planted changes (each target must exist exactly once, so a refactor cannot hide one)."""
    src = SOURCE.read_text()
    for old, new in changes:
        assert src.count(old) == 1, f"planting {name}: {old!r} not found exactly once"
        src = src.replace(old, new)
    path = tmp_path / f"attention_{name}.py"
    path.write_text(src)
    return load_module(path, f"attention_{name}")


@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("layout", ["dense", "packed", "many"])
def test_fused_dq_has_the_two_kernel_bits(layout, block_n, monkeypatch):
    """dq, dk, dv bit for bit equal with and without BWD_DQ_FUSED, for a key tile of one dq block and of two
    (the interpreter's DKDV_BLOCK_N keeps its ratio to DQ_BLOCK_N: 4 or 8 keys), two seeds each (one for the 12
    packed sequences of 1 to 29)."""
    import tik_kernels.ops.attention as A

    for seed in (0,) if layout == "many" else (0, 1):
        fwd, q, k, v, go = _case(A, layout, seed)
        want = _grads(A, fwd, q, k, v, go, 0, block_n, monkeypatch)
        got = _grads(A, fwd, q, k, v, go, 1, block_n, monkeypatch)
        for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
            assert same_bits(a, b), f"{layout} seed {seed} DKDV_BLOCK_N {block_n}: fused {name} differs"


@pytest.mark.parametrize("layout", ["dense", "packed", "many"])
def test_dq_kernel_tile_and_tma_keep_the_bits(layout, monkeypatch):
    """The dq kernel's free knobs change no bit: a step of two dq blocks (DQ_TILE_N = 2 * DQ_BLOCK_N: two chained
    dots), K and V through TMA descriptors, and both (dq, dk, dv against the root's CONFIG, two seeds)."""
    import tik_kernels.ops.attention as A

    for seed in (0,) if layout == "many" else (0, 1):
        fwd, q, k, v, go = _case(A, layout, seed)
        want = _grads(A, fwd, q, k, v, go, 0, 64, monkeypatch)
        for tile, tma in ((128, 0), (64, 1), (128, 1)):
            monkeypatch.setitem(A.CONFIG, "DQ_TILE_N", tile)
            monkeypatch.setitem(A.CONFIG, "DQ_TMA", tma)
            got = _grads(A, fwd, q, k, v, go, 0, 64, monkeypatch)
            for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
                assert same_bits(a, b), f"{layout} seed {seed} DQ_TILE_N {tile} DQ_TMA {tma}: {name} differs"


@pytest.mark.parametrize("layout", ["dense", "packed", "many"])
def test_longest_first_launch_keeps_the_bits(layout, monkeypatch):
    """Prefill's and the dq kernel's row tiles launched last first (FWD_LONGEST_FIRST, DQ_LONGEST_FIRST) change
    which program computes a tile, never a bit: the output and dq, dk, dv equal the root CONFIG's."""
    import tik_kernels.ops.attention as A

    fwd, q, k, v, go = _case(A, layout, 2)
    _launch_keeps_bits(A, fwd, q, k, v, go, f"{layout}, launched longest first", monkeypatch,
                       FWD_LONGEST_FIRST=1, DQ_LONGEST_FIRST=1)


def _one_loop_matches_two(A, fwd, qkv, layout: str, tmas: tuple, monkeypatch) -> None:
    """fwd with FWD_ONE_LOOP gives the two loops' output bit for bit, with each FWD_TMA in `tmas`."""
    for tma in tmas:
        monkeypatch.setitem(A.CONFIG, "FWD_TMA", tma)
        monkeypatch.setitem(A.CONFIG, "FWD_ONE_LOOP", 0)
        want = fwd(*qkv)
        monkeypatch.setitem(A.CONFIG, "FWD_ONE_LOOP", 1)
        assert same_bits(fwd(*qkv), want), f"{layout}: FWD_ONE_LOOP with FWD_TMA {tma} changed the output"


@pytest.mark.parametrize("layout", ["dense", "aligned", "packed", "many"])
def test_one_loop_forward_keeps_the_bits(layout, monkeypatch):
    """The diagonal blocks inside the sequence walked in the unmasked loop (FWD_ONE_LOOP, the CONFIG's), with TMA
    loads and with pointers, give the two loops' output bit for bit: S off the block grid (a block crossing the end
    stays in the masked loop), S on it (no such block), packed and many short sequences."""
    import tik_kernels.ops.attention as A

    if layout == "aligned":
        gen = torch.Generator().manual_seed(5)
        q, k, v = (torch.randn(2, h, 16, 16, generator=gen).to(torch.bfloat16) for h in (4, 2, 2))
        fwd = A.attention_prefill
    else:
        fwd, q, k, v, _ = _case(A, layout, 3)
    _one_loop_matches_two(A, fwd, (q, k, v), layout, (0, 1), monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["dense", "off_grid", "packed", "many"])
def test_gpu_one_loop_forward_keeps_the_bits(layout, monkeypatch):
    """FWD_ONE_LOOP on the GPU (B=1 S=4096 Hq=32 Hk=8 D=128 bf16; S = 1000, off the 128-key grid; packed 700 + 2300 +
    50; 40 packed sequences of 1 to 298), with TMA and with pointers: the output bit for bit as the two loops'."""
    import tik_kernels.ops.attention as A

    if layout == "off_grid":
        gen = torch.Generator(device="cuda").manual_seed(7)
        q, k, v = (torch.randn(1, h, 1000, 128, generator=gen, device="cuda").to(torch.bfloat16) for h in (32, 8, 8))
        fwd = A.attention_prefill
    else:
        fwd, q, k, v, _ = _case(A, layout, 7, device="cuda", big=True)
    _one_loop_matches_two(A, fwd, (q, k, v), layout, (1, 0), monkeypatch)


def test_one_loop_that_skips_a_diagonal_mask_is_seen(tmp_path, monkeypatch):
    """The check above can fail: a one-loop walk that leaves the first diagonal block unmasked (planted) changes the
    output."""
    import tik_kernels.ops.attention as A

    fwd, q, k, v, _ = _case(A, "dense", 3)
    monkeypatch.setitem(A.CONFIG, "FWD_ONE_LOOP", 0)
    want = fwd(q, k, v)
    bad = _planted(tmp_path, "one_loop_unmasked_diagonal", ("            if j >= n_full:\n",
                                                             "            if j > n_full:\n"))
    monkeypatch.setitem(bad.CONFIG, "FWD_ONE_LOOP", 1)
    assert not same_bits(bad.attention_prefill(q, k, v), want)


def test_dq_kernel_double_step_order_change_is_seen(tmp_path, monkeypatch):
    """A double step whose two dots run second half first (planted in `_dq_dots`, which the dq kernel shares with
    the fused path) changes dq's bits on the order-sensitive case (so the test above would see a step that did not
    keep the key order); dk and dv keep theirs."""
    import tik_kernels.ops.attention as A

    fwd, q, k, v, go = _order_sensitive_case(A)
    want = _grads(A, fwd, q, k, v, go, 0, 64, monkeypatch)
    bad = _planted(tmp_path, "dq_halves_swapped",
                   ("        acc = tl.dot(ds0, k0, acc)\n        acc = tl.dot(ds1, k1, acc)\n",
                    "        acc = tl.dot(ds1, k1, acc)\n        acc = tl.dot(ds0, k0, acc)\n"))
    monkeypatch.setitem(bad.CONFIG, "DQ_TILE_N", 128)
    got = _grads(bad, bad.attention_prefill, q, k, v, go, 0, 64, monkeypatch)
    assert same_bits(got[1], want[1]) and same_bits(got[2], want[2])
    assert not same_bits(got[0], want[0]), "swapped halves of the dq kernel's double step not seen"


def test_fused_candidate_passes_the_contracts_gradient_checks_with_the_roots_bits(tmp_path):
    """A candidate file whose CONFIG has BWD_DQ_FUSED 1 (and a key tile of two dq blocks), as the tuner writes it:
    every gradient check of the contract's CPU plan passes, root_bits of the dense and packed backward included."""
    from test_attention import CONTRACT, run_checks

    cand = _planted(tmp_path, "fused_candidate", ('"BWD_DQ_FUSED": 0,', '"BWD_DQ_FUSED": 1,'),
                    ('"DKDV_BLOCK_N": 64,', '"DKDV_BLOCK_N": 128,'))
    root = load_module(SOURCE, "attention_root_bwd")
    results = run_checks(CONTRACT.plan("cpu", 0), cand, root,
                         select=lambda n: "grad" in n or "backward" in n)
    bad = {n: r.detail for n, r in results.items() if not r.passed}
    assert not bad, bad
    assert sum(r.requirement == "root_bits" for r in results.values()) == 4


def test_fused_rejects_a_key_tile_that_is_not_one_or_two_dq_blocks(monkeypatch):
    import tik_kernels.ops.attention as A

    fwd, q, k, v, go = _case(A, "dense", 0)
    monkeypatch.setitem(A.CONFIG, "DQ_BLOCK_N", 16)  # the interpreter key tile: 4 * 64 // 16 = 16, four dq blocks
    with pytest.raises(ValueError, match="DKDV_BLOCK_N"):
        _grads(A, fwd, q, k, v, go, 1, 64, monkeypatch)


def _order_sensitive_case(A):
    """Dense inputs whose dq depends on the order of a row's KV blocks (4 keys each in the interpreter) far above
    bf16's rounding: q = 0 (uniform softmax), so two keys with the same v get the same ds; block 2 is block 0 with
    k negated (their dq terms cancel exactly), block 1 has k = 0, later blocks are 2**-20 as large. In key order,
    X + 0 - X + small... is exact; any order that adds small terms between +X and -X rounds them to X's ulp."""
    gen = torch.Generator().manual_seed(3)
    B, Hq, Hk, S, D = 1, 4, 2, 19, 16
    q = torch.zeros(B, Hq, S, D)
    k, v = torch.randn(B, Hk, S, D, generator=gen), torch.randn(B, Hk, S, D, generator=gen)
    k[:, :, :4] *= 2.0**20
    k[:, :, 4:8] = 0.0
    k[:, :, 8:12] = -k[:, :, :4]
    v[:, :, 8:12] = v[:, :, :4]
    go = torch.randn(B, Hq, S, D, generator=gen)
    return (A.attention_prefill, *(x.to(torch.bfloat16) for x in (q, k, v, go)))


def test_planted_order_changes_are_seen(tmp_path, monkeypatch):
    """The bit check sees a fused dq that adds a tile's blocks in another order: the programs walking the key
    blocks last to first (with no wait, which would never come), and, for a double key tile, its two halves
    swapped. dk and dv keep their bits (only dq's order moved)."""
    import tik_kernels.ops.attention as A

    fwd, q, k, v, go = _order_sensitive_case(A)
    want = _grads(A, fwd, q, k, v, go, 0, 64, monkeypatch)
    for block_n in (64, 128):  # the case is order-sensitive, and the root's fused path keeps the order
        got = _grads(A, fwd, q, k, v, go, 1, block_n, monkeypatch)
        assert all(same_bits(a, b) for a, b in zip(got, want, strict=True))
    reverse = _planted(tmp_path, "reverse",
                       ("        pid_n = ticket // n_bh\n",
                        "        pid_n = tl.num_programs(0) // n_bh - 1 - ticket // n_bh\n"),
                       ("w_ptrs = w_ptrs + _wait_turn(c_ptr, turn, INTERPRET)", "pass"))
    swapped = _planted(tmp_path, "halves_swapped",
                       ("        acc = tl.dot(ds0, k0, acc)\n        acc = tl.dot(ds1, k1, acc)\n",
                        "        acc = tl.dot(ds1, k1, acc)\n        acc = tl.dot(ds0, k0, acc)\n"))
    for bad, block_n in ((reverse, 64), (reverse, 128), (swapped, 128)):
        got = _grads(bad, bad.attention_prefill, q, k, v, go, 1, block_n, monkeypatch)
        assert same_bits(got[1], want[1]) and same_bits(got[2], want[2])
        assert not same_bits(got[0], want[0]), f"{bad.__name__} (DKDV_BLOCK_N {block_n}) not seen"


_COMPILE = textwrap.dedent("""
    import inspect, os, sys
    os.environ["TRITON_INTERPRET"] = "0"  # the real compiler: kernels are JITFunctions, not interpreted
    import triton
    from triton.backends.compiler import GPUTarget
    from tik_kernels.contract import load_module
    ptr = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", do_ptr="*bf16", dk_ptr="*bf16", dv_ptr="*bf16",
               lse_ptr="*fp32", delta_ptr="*fp32", cu_ptr="*i32", ws_ptr="*fp32", cnt_ptr="*i32", ds_ptr="*bf16",
               ds_base_ptr="*i64", ds_tile_ptr="*i64",
               qk_scale="fp32", sm_scale="fp32")
    for i, path in enumerate(sys.argv[1:]):
        fn = load_module(path, f"attention_sm90_{i}")._attn_bwd_dkdv_kernel
        cases = ((64, False, False), (64, False, True), (128, True, True)) if i == 0 else ((64, False, True),)
        for block_n, varlen, fused in cases:
            const = dict(G=4, D=128, BLOCK_M=64, BLOCK_N=block_n, VARLEN=varlen, UPCAST=False, FUSED=fused, SUB=64,
                         DS_STORE=False)
            sig = {n: "constexpr" if n in const else ptr.get(n, "i32") for n in inspect.signature(fn.fn).parameters}
            k = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=const),
                               target=GPUTarget("cuda", 90, 32),
                               options=dict(num_warps=8, num_stages=2, enable_fp_fusion=False))
            ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
            print(i, block_n, int(fused), int("ld.acquire.gpu.global" in ptx),
                  int("atom.global.gpu.release.exch" in ptx), ttgir.count("async_copy_global_to_local"))
""")


def test_fused_kernel_compiles_for_sm90_with_its_atomics_and_pipelining(tmp_path):
    """The fused dk/dv kernel compiles for an H200 target (key tiles of one and two dq blocks); the spin (acquire
    loads) and the hand-over (release exchange) survive the compiler, and the row-tile walk is software-pipelined
    as much as without fusion (asynchronous copies of lse and delta). A planted variant with a relaxed hand-over
    (the dq stores not ordered before the next program's loads) and a CTA barrier in the walk (which turns the
    pipelining off) is seen on both counts."""
    src = SOURCE.read_text()
    planted = tmp_path / "attention_relaxed_barrier.py"
    for old, new in (('tl.atomic_xchg(c_ptr, turn, sem="release")', 'tl.atomic_xchg(c_ptr, turn, sem="relaxed")'),
                     ("    _pass_turn(c_ptr, turn + BN // SUB, INTERPRET)\n",
                      "    tl.debug_barrier()\n    _pass_turn(c_ptr, turn + BN // SUB, INTERPRET)\n")):
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    planted.write_text(src)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", _COMPILE, str(SOURCE), str(planted)], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines()[-4:]]
    copies = rows[0][5]  # the kernel without fusion
    assert rows[0][:5] == ["0", "64", "0", "0", "0"] and int(copies) > 0, out.stdout
    assert rows[1:3] == [["0", "64", "1", "1", "1", copies], ["0", "128", "1", "1", "1", copies]], out.stdout
    assert rows[3] == ["1", "64", "1", "1", "0", "0"], out.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("layout", ["dense", "packed", "many"])
def test_gpu_fused_dq_bits_and_determinism(layout, block_n, monkeypatch):
    """On the H200 (B=1 S=4096 Hq=32 Hk=8 D=128 bf16; packed 700 + 2300 + 50; 40 packed sequences of 1 to 298, most
    programs past their sequence's end): the fused dq/dk/dv are
    deterministic over two runs and, if the MMA gives ds @ K the same bits whichever way ds was computed
    (transposed, from K Q^T, in the dk/dv kernel), equal to the two-kernel path. The timeout catches a hang."""
    import tik_kernels.ops.attention as A

    fwd, q, k, v, go = _case(A, layout, 5, device="cuda", big=True)
    want = _grads(A, fwd, q, k, v, go, 0, block_n, monkeypatch)
    got = _grads(A, fwd, q, k, v, go, 1, block_n, monkeypatch)
    again = _grads(A, fwd, q, k, v, go, 1, block_n, monkeypatch)
    torch.cuda.synchronize()
    assert all(same_bits(a, b) for a, b in zip(got, again, strict=True)), "fused backward not deterministic"
    assert same_bits(got[1], want[1]) and same_bits(got[2], want[2]), "fused dk/dv differ from the two-kernel path"
    diff = (got[0].float() - want[0].float()).abs().max().item()
    assert same_bits(got[0], want[0]), (
        f"fused dq differs from the dq kernel's bits (max |diff| {diff:.3g}): ds from K Q^T does not give the MMA "
        "the bits of ds from Q K^T; BWD_DQ_FUSED=1 would be new root bits (the lead decides)")
