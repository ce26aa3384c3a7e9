"""Planted linear bugs shared by test_linear.py (the root) and test_linear_tree.py (the fixed-tree candidate).

Both implementation files expose `linear(x, w)` and `_matmul(x, w, out_dtype, block_k=...)`, and the contract
must catch the same bugs planted in either: a variant is the file's source, edited or with an entry point
appended, loaded from disk like a candidate.
"""

from __future__ import annotations

from pathlib import Path

from tik_kernels.contract import load_module

#: split K in two fp32 halves once the batch is "large" (batch invariance must fail, accuracy must not)
SPLIT_K_BY_T = '''
_root_linear = linear


def linear(x, w):
    # planted: split K in two fp32 halves once the batch is "large"
    if x.shape[0] > 4:
        h = x.shape[1] // 2
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
