"""Planted linear bugs and entry-point checks for test_linear.py.

The root exposes `linear(x, w)` and `_matmul(x, w, out_dtype, block_k=...)`, and the contract must catch
the bugs planted in it: a variant is the file's source, edited or with an entry point appended, loaded from
disk like a candidate.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tik_kernels.contract import load_module

#: split K in two fp32 halves once the batch is "large" (batch invariance must fail, accuracy must not)
SPLIT_K_BY_T = '''
_root_linear = linear


def linear(x, w):
    # planted: split K in two fp32 parts once the batch is "large", off a chunk boundary (a split at a KCHUNK
    # boundary adds the same chunk sums in the same order: that is the root's own tree, not a bug)
    if x.shape[0] > 4:
        h = x.shape[1] // 2 + 8
        part = _matmul(x[:, :h], w[:, :h], torch.float32) + _matmul(x[:, h:], w[:, h:], torch.float32)
        return part.to(x.dtype)
    return _root_linear(x, w)
'''

#: the reduction order alternates from call to call (determinism must fail)
ALTERNATING_BLOCK_K = '''
_calls = [0]


def linear(x, w):
    # planted: the reduction order alternates from call to call
    _calls[0] += 1
    return _matmul(x, w, block_k=16 if _calls[0] % 2 else 64)
'''


def failed(results, requirement: str | None = None) -> list:
    return [r for r in results if not r.passed and (requirement is None or r.requirement == requirement)]


def crashed(results) -> list:
    """Checks that failed because a probe of the candidate raised: a planted variant meant to compute wrong bits must
    run, or a check "catches" it for the wrong reason (session 21: a planted combine passed only because Triton's
    interpreter refused its mask)."""
    return [r for r in results if not r.passed and "probe" in (r.detail or "") and "failed:" in (r.detail or "")]


def variant(root_src: str, tmp_path: Path, name: str, old: str | None = None, new: str | None = None,
            append: str = "", edits: tuple = ()):
    """`root_src` with `old -> new` and `edits` applied (each must match exactly once) and `append` added."""
    src = root_src
    for o, n in ((old, new),) * (old is not None) + tuple(edits):
        assert src.count(o) == 1, f"planted edit {name}: {o!r} not found exactly once in the root"
        src = src.replace(o, n)
    path = tmp_path / f"{name}.py"
    path.write_text(src + append)
    return load_module(path, f"tik_planted_{name}")


def forward_matches_float64(L, T: int, N: int, K: int) -> None:
    """`L.linear` against a float64 product: within 3x torch's own bf16 error."""
    x = torch.randn(T, K).to(torch.bfloat16)
    w = torch.randn(N, K).to(torch.bfloat16)
    y = L.linear(x, w)
    ref = x.double() @ w.double().t()
    torch_err = ((x @ w.t()).double() - ref).norm() / ref.norm()
    err = (y.double() - ref).norm() / ref.norm()
    assert y.dtype == torch.bfloat16 and y.shape == (T, N)
    # the interpreter truncates to bf16 where torch rounds: within 3× torch's own bf16 error
    assert err <= 3 * torch_err + 1e-6, (float(err), float(torch_err))


def strided_and_batched_inputs(L) -> None:
    """`L.linear` on a 3-D x, a transposed x and an empty batch; a wrong w shape is refused."""
    x = torch.randn(2, 5, 32).to(torch.bfloat16)
    w = torch.randn(24, 32).to(torch.bfloat16)
    y = L.linear(x, w)
    assert y.shape == (2, 5, 24)
    flat = L.linear(x.reshape(10, 32), w)
    assert torch.equal(y.reshape(10, 24).view(torch.int16), flat.view(torch.int16))
    # a transposed (non-contiguous) x gives the same bits as its contiguous copy
    xt = x.reshape(10, 32).t().contiguous().t()
    assert not xt.is_contiguous()
    assert torch.equal(L.linear(xt, w).view(torch.int16), flat.view(torch.int16))
    assert L.linear(torch.empty(0, 32, dtype=torch.bfloat16), w).shape == (0, 24)
    with pytest.raises(ValueError):
        L.linear(x, w.t())
