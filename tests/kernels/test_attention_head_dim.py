"""Head dim 256 on an H200: the CONFIG's launches (128-key K and V tiles of 64 KB each) would ask for more shared
memory than the GPU has; `_for_head_dim` picks smaller ones. Checked by compiling for sm_90 on the CPU
(benchmarks/attn_ir_offline.py --head-dim): every launch the host makes fits, and without the clamp some do not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "tik_kernels" / "ops" / "attention.py"


def _offline(head_dim: int, source: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "0"}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "attn_ir_offline.py"), "--head-dim",
                           str(head_dim), "--source", str(source)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)


@pytest.mark.parametrize("head_dim", [128, 256])
def test_every_launch_fits_an_h200(head_dim):
    out = _offline(head_dim, SOURCE)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("[fits]") == 7, out.stdout


def test_without_the_clamp_head_dim_256_does_not_fit(tmp_path):
    """Planted: no clamp, and the forward at 128 rows of 8 warps and 2 stages (the CONFIG's until session 28, and a
    launch the tuner may pick: the CONFIG's own 64 rows and 1 stage fit at 256 unclamped)."""
    src = SOURCE.read_text()
    old = "    if d <= _WIDE_HEAD or INTERPRET:\n        return cfg\n"
    tiles = '    "BLOCK_M": 64,\n    "num_warps": 4,\n    "num_stages": 1,\n'
    assert src.count(old) == 1 and src.count(tiles) == 1
    planted = tmp_path / "attention_no_clamp.py"
    planted.write_text(src.replace(old, "    return cfg\n").replace(
        tiles, '    "BLOCK_M": 128,\n    "num_warps": 8,\n    "num_stages": 2,\n'))
    out = _offline(256, planted)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    over = [line.split(",")[0] for line in out.stdout.splitlines() if "OVER" in line]
    assert {"forward", "decode", "dq kernel"} <= set(over), out.stdout


def _check_head_dim(device: str, D: int, S: int, monkeypatch) -> None:
    """At head dim D: decode rows (cache tail poisoned with NaN) equal the prefill rows; packed sequences equal
    each alone; the output is within bf16 rounding of a float64 reference; gradients are deterministic, and the
    stored-dS backward gives the dq kernel's bits."""
    import tik_kernels.ops.attention as A
    from tik_kernels.contract import same_bits

    gen = torch.Generator(device=device).manual_seed(D)
    Hq, Hk = 8, 2

    def r(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(torch.bfloat16)

    q, k, v = r(1, Hq, S, D), r(1, Hk, S, D), r(1, Hk, S, D)
    o = A.attention_prefill(q, k, v)
    # float64 reference (GQA: each KV head serves Hq / Hk query heads)
    kk, vv = (x.double().repeat_interleave(Hq // Hk, dim=1) for x in (k, v))
    s = (q.double() @ kk.transpose(-1, -2)) / D**0.5
    s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=device).triu(1), float("-inf"))
    ref = torch.softmax(s, -1) @ vv
    err = (o.double() - ref).abs().max().item()
    assert err <= 2e-2, f"D {D}: |o - float64| {err:.3g}"
    # decode at a few positions, cache past each length poisoned
    pos = sorted({0, 1, S // 3, S - 2, S - 1})
    cap = S + 64
    kc = torch.full((len(pos), Hk, cap, D), float("nan"), device=device, dtype=torch.bfloat16)
    vc = kc.clone()
    for i, p in enumerate(pos):
        kc[i, :, : p + 1], vc[i, :, : p + 1] = k[0, :, : p + 1], v[0, :, : p + 1]
    lens = torch.tensor([p + 1 for p in pos], dtype=torch.int32, device=device)
    qd = torch.stack([q[0, :, p] for p in pos])[:, :, None]
    out = A.attention_decode(qd.contiguous(), kc, vc, lens)
    for i, p in enumerate(pos):
        assert same_bits(out[i, :, 0], o[0, :, p]), f"D {D}: decode at {p} differs from prefill"
    # packed: two sequences, each as alone
    cut = S // 3
    pq, pk, pv = (x[0].transpose(0, 1).contiguous() for x in (q, k, v))
    cu = torch.tensor([0, cut, S], dtype=torch.int32, device=device)
    packed = A.attention_varlen(pq, pk, pv, cu, max_seqlen=S - cut)
    alone = A.attention_prefill(q[:, :, cut:], k[:, :, cut:], v[:, :, cut:])
    assert same_bits(packed[cut:].transpose(0, 1)[None], alone), f"D {D}: packed differs from alone"
    assert same_bits(packed[:cut].transpose(0, 1)[None], o[:, :, :cut]), f"D {D}: packed prefix differs"
    # gradients: deterministic, and the stored-dS path has the dq kernel's bits
    go = r(1, Hq, S, D)

    def grads():
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        A.attention_prefill(*leaves).backward(go)
        return [x.grad for x in leaves]

    monkeypatch.setitem(A.CONFIG, "BWD_DS_STORE", 0)
    want = grads()
    monkeypatch.setitem(A.CONFIG, "BWD_DS_STORE", 1)
    monkeypatch.setitem(A.CONFIG, "DS_MIN_PROGRAMS", 0)
    got, again = grads(), grads()
    for name, a, b, c in zip(("dq", "dk", "dv"), got, want, again, strict=True):
        assert same_bits(a, c), f"D {D}: {name} not deterministic"
        assert same_bits(a, b), f"D {D}: stored-dS {name} differs from the dq kernel's"


def test_head_dim_checks_run_on_the_interpreter(monkeypatch):
    """The GPU test's checks, on the CPU at a small head dim (the interpreter has no shared memory to run out of:
    this shows the checks themselves hold)."""
    _check_head_dim("cpu", 32, 23, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 256])
def test_gpu_head_dims(D, monkeypatch):
    """On the H200 at head dims 64 and 256 (Hq 8, Hk 2, 700 positions): every launch runs (at 256 the CONFIG's
    would not fit in shared memory: `_for_head_dim`), and the bitwise checks of `_check_head_dim` hold."""
    _check_head_dim("cuda", D, 700, monkeypatch)
