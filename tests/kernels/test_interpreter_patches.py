"""TIK's adjustments to Triton's CPU interpreter (`tik_kernels/_interpreter.py`), each with the same bits as Triton's
own path:
a helper called from a kernel no longer patches `triton.language` again when the running launch has patched it
already (one scan per launch and module instead of one per call), and a scan is recorded once per modules and state,
then replayed; integer-overflow checks that `device_assert` would
discard are not computed; the numpy dtype of a Triton type is looked up, not rebuilt; bf16 <-> fp32 casts without
subnormal inputs are bit shifts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import tik_kernels  # noqa: F401 (sets the interpreter up)
from tik_kernels._runtime import INTERPRET

pytestmark = pytest.mark.skipif(not INTERPRET, reason="the interpreter's patches (CPU only)")


@triton.jit
def _scaled(x, s):
    return x * s + 1.0


@triton.jit
def _kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(4):  # a helper of this module, called every iteration, and the standard library's tl.sum
        x = tl.load(x_ptr + i * BLOCK + offs, mask=offs < n, other=0.0)
        acc += _scaled(x, 0.5 + i)
    tl.store(y_ptr + offs, acc / (tl.sum(acc, axis=0) + 3.0), mask=offs < n)


def _run(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty(32, dtype=torch.float32)
    _kernel[(1,)](x, y, 32, BLOCK=32)
    return y


def test_helpers_skip_the_repeated_patch_with_the_same_bits(monkeypatch):
    from triton.runtime import interpreter as it

    assert getattr(it.InterpretedFunction.__call__, "_tik_once", False), "the patch is not installed"
    x = torch.randn(4 * 32, generator=torch.Generator().manual_seed(0))
    scans = []
    real = it._patch_lang
    monkeypatch.setattr(it, "_patch_lang", lambda fn: (scans.append(fn.__name__), real(fn))[1])
    fast = _run(x)
    # the launch, then the first tl.sum (its module sees tl.core, which the launch did not patch); not the 4 helpers
    assert len(scans) <= 2, scans
    assert scans[0] == "_kernel" and "_scaled" not in scans
    # Triton's own path: every helper call patches again
    monkeypatch.setattr(it.InterpretedFunction, "__call__", it.InterpretedFunction.__call__.__wrapped_original__)
    grid_call = it.GridExecutor.__call__
    while hasattr(grid_call, "__wrapped_original__"):  # under the quiet launch (`_quiet_float_warnings`) too
        grid_call = grid_call.__wrapped_original__
    monkeypatch.setattr(it.GridExecutor, "__call__", grid_call)
    scans.clear()
    slow = _run(x)
    assert scans.count("_scaled") == 4
    assert torch.equal(fast.view(torch.int32), slow.view(torch.int32))


@triton.jit
def _masked_divide_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    tl.store(y_ptr + offs, x / x, mask=m)  # the masked lanes divide 0 by 0, as a GPU's do, silently


def test_a_launch_raises_no_numpy_float_warning():
    """A masked lane's 0 / 0 is computed and never stored: no warning on the CPU (`_interpreter._quiet_float_warnings`;
    `tik e2e` printed numpy's "invalid value encountered in divide" among its progress lines), the stored lanes the
    same."""
    import warnings

    x = torch.arange(1, 5, dtype=torch.float32)
    y = torch.zeros(16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _masked_divide_kernel[(1,)](x, y, 4, BLOCK=16)
    assert torch.equal(y, torch.tensor([1.0] * 4 + [0.0] * 12))


@triton.jit
def _index_kernel(x_ptr, y_ptr, scale, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    i = tl.program_id(0) * BLOCK + offs
    wrapped = i * scale + 7 - offs  # int32 arithmetic that overflows for large scale: wraps, as on the GPU
    x = tl.load(x_ptr + i).to(tl.float32)
    tl.store(y_ptr + i, (x * 1.5 + wrapped.to(tl.float32)).to(tl.bfloat16))


def test_overflow_checks_off_with_the_same_bits(monkeypatch):
    import dataclasses

    from triton.runtime import interpreter as it

    assert it.interpreter_builder.options.sanitize_overflow is False, "the patch is not installed"
    assert it.interpreter_builder.options.debug is False
    x = torch.randn(64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    fast, slow = torch.empty_like(x), torch.empty_like(x)
    _index_kernel[(2,)](x, fast, 2**30 + 3, BLOCK=32)
    monkeypatch.setattr(it.interpreter_builder, "options",
                        dataclasses.replace(it.interpreter_builder.options, sanitize_overflow=True))
    _index_kernel[(2,)](x, slow, 2**30 + 3, BLOCK=32)
    assert torch.equal(fast.view(torch.int16), slow.view(torch.int16))


def _fp32_bits_of_every_exponent() -> np.ndarray:
    rng = np.random.default_rng(0)
    exponents = np.arange(256, dtype=np.uint32) << np.uint32(23)
    mantissas = np.concatenate([np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x10000, 0x7FFFFF], dtype=np.uint32),
                                rng.integers(0, 1 << 23, 56, dtype=np.uint32)])
    bits = (exponents[:, None] | mantissas[None, :]).ravel()
    return np.concatenate([bits, bits | np.uint32(1 << 31)])


def test_fast_bf16_fp32_casts_match_tritons_routine():
    from triton.runtime import interpreter as it

    fast, slow = it._convert_float, it._convert_float.__wrapped_original__
    assert getattr(fast, "_tik_fast", False), "the patch is not installed"
    every_bf16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    normal = every_bf16[~(((every_bf16 & 0x7F80) == 0) & ((every_bf16 & 0x7F) != 0))]
    fp32 = _fp32_bits_of_every_exponent()
    fp32_normal = fp32[~(((fp32 & 0x7F800000) == 0) & ((fp32 & 0x7FFFFF) != 0))]
    cases = [(every_bf16, tl.bfloat16, tl.float32), (normal, tl.bfloat16, tl.float32),
             (normal[:128].reshape(-1, 16)[::2, 1:], tl.bfloat16, tl.float32),
             (normal[5:6].reshape(()), tl.bfloat16, tl.float32),
             (fp32.view(np.float32), tl.float32, tl.bfloat16), (fp32_normal.view(np.float32), tl.float32, tl.bfloat16),
             (fp32_normal[:4096].view(np.float32).reshape(-1, 8)[::3, 1::2], tl.float32, tl.bfloat16)]
    for data, src, dst in cases:
        got, want = fast(data, src, dst, None), slow(data, src, dst, None)
        assert got.dtype == want.dtype and got.shape == want.shape, (src, dst, data.shape)
        assert np.array_equal(got, want), (src, dst, data.shape)
    # another rounding mode, or other types, go to Triton's routine unchanged
    data = fp32_normal.view(np.float32)
    assert np.array_equal(fast(data, tl.float32, tl.bfloat16, "rtne-mode"), slow(data, tl.float32, tl.bfloat16,
                                                                                   "rtne-mode"))
    assert np.array_equal(fast(data[:64], tl.float32, tl.float16, None), slow(data[:64], tl.float32, tl.float16, None))


def test_np_dtype_lookup_matches_tritons():
    from triton.runtime import interpreter as it

    fast, slow = it._get_np_dtype, it._get_np_dtype.__wrapped_original__
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float16,
               tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv]
    types = scalars + [tl.pointer_type(t) for t in scalars] + [tl.block_type(t, [4, 8]) for t in scalars]
    types += [tl.block_type(tl.pointer_type(tl.float32), [16])]
    for _ in range(2):  # the second time from what the first kept
        for t in types:
            assert fast(t) == slow(t), t


def _tritons_front_end(monkeypatch) -> None:
    """Put Triton's own front end back for the rest of a test (the patches keep Triton's functions)."""
    import sys

    from triton.language import core, semantic
    from triton.runtime import interpreter as it

    for owner, name in ((core.block_type, "__init__"), (core.block_type, "__eq__"), (core.tensor, "__init__"),
                        (semantic.TritonSemantic, "broadcast_impl_value"), (semantic.TritonSemantic, "cast"),
                        (semantic.TritonSemantic, "binary_op_type_checking_impl")):
        fast = getattr(owner, name)
        assert getattr(fast, "_tik_fast", False), f"{owner.__name__}.{name}: the patch is not installed"
        monkeypatch.setattr(owner, name, fast.__wrapped_original__)
    unwrap = core._unwrap_if_constexpr
    assert getattr(unwrap, "_tik_fast", False)
    for mod_name, module in list(sys.modules.items()):
        if mod_name.startswith("triton.") and getattr(module, "_unwrap_if_constexpr", None) is unwrap:
            monkeypatch.setattr(module, "_unwrap_if_constexpr", unwrap.__wrapped_original__)
    assert getattr(it._patch_attr, "_tik_fast", False)
    monkeypatch.setattr(it, "_patch_attr", it._patch_attr.__wrapped_original__)


@triton.jit
def _shapes_kernel(x_ptr, b_ptr, i_ptr, y_ptr, z_ptr, w_ptr, n, scale, M: tl.constexpr, N: tl.constexpr):
    rows = tl.arange(0, M)
    cols = tl.arange(0, N)
    mask = (rows[:, None] < n) & (cols[None, :] < N)  # [M, 1] with [1, N]: both broadcast
    offs = rows[:, None] * N + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)  # fp32 [M, N]
    b = tl.load(b_ptr + offs, mask=mask, other=0.0)  # bf16 [M, N]
    i = tl.load(i_ptr + offs, mask=mask, other=0)  # int32 [M, N]
    row = tl.sum(x, axis=1)  # [M]
    y = x * b + row[:, None] - 1.5  # fp32 with bf16 (a cast), [M, N] with [M, 1], with a scalar
    y = y / (tl.abs(x) + 1.0) + (i % 7).to(tl.float32) * scale  # a div; an int mod; fp32 with a scalar argument
    bb = b * b + b  # bf16 with bf16 stays bf16
    ii = i * 3 + i // 2 - (i >> 1)  # int32 arithmetic with scalars and with itself
    tl.store(y_ptr + offs, y, mask=mask)
    tl.store(z_ptr + offs, bb, mask=mask)
    tl.store(w_ptr + offs, ii + tl.where(x > 0, 1, -1), mask=mask)
    acc = tl.zeros((M, N), dtype=tl.float32) + tl.dot(x, tl.trans(x)) * 0.5  # a dot on the way (M == N)
    tl.store(y_ptr + M * N + offs, acc + y, mask=mask)


def _run_shapes(x, b, i):
    y = torch.empty(2 * 16 * 16, dtype=torch.float32)
    z = torch.empty(16 * 16, dtype=torch.bfloat16)
    w = torch.empty(16 * 16, dtype=torch.int32)
    _shapes_kernel[(1,)](x, b, i, y, z, w, 13, 0.25, M=16, N=16)
    return y, z, w


def test_fast_front_end_gives_tritons_bits(monkeypatch):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(256, generator=g)
    x[::17] = float("nan")
    x[5], x[6], x[7] = float("inf"), -0.0, 1e-40  # inf, a negative zero, a subnormal
    b = torch.randn(256, generator=g).to(torch.bfloat16)
    i = torch.randint(-1000, 1000, (256,), generator=g, dtype=torch.int32)
    fast = _run_shapes(x, b, i)
    _tritons_front_end(monkeypatch)
    slow = _run_shapes(x, b, i)
    for f, s in zip(fast, slow, strict=True):
        assert f.dtype == s.dtype
        assert torch.equal(f.view(torch.uint8), s.view(torch.uint8))


def test_fast_block_and_tensor_types_match_tritons():
    from triton.language import core

    block, tensor = core.block_type, core.tensor
    shapes = [[16], [1, 32], [4, 8, 2], [1], [2, 1, 1, 4]]
    for dt in (tl.float32, tl.bfloat16, tl.int1, tl.pointer_type(tl.float16)):
        for shape in shapes:
            for given in (list(shape), core.tuple(list(shape)), [tl.constexpr(s) for s in shape]):
                for _ in range(2):  # the second time from what the first kept
                    fast = block(dt, given)
                    slow = block.__new__(block)
                    block.__init__.__wrapped_original__(slow, dt, given)
                    assert fast == slow and slow == fast
                    assert type(fast.shape) is type(slow.shape) and fast.shape.values == slow.shape.values
                    assert fast.shape.type == slow.shape.type and fast.numel == slow.numel
                    assert fast.name == slow.name and str(fast) == str(slow) and fast.element_ty == slow.element_ty
                    for ty in (fast, dt):
                        ft, st = tensor(None, ty), tensor.__new__(tensor)
                        tensor.__init__.__wrapped_original__(st, None, ty)
                        assert ft.shape.values == st.shape.values and ft.shape.type == st.shape.type
                        assert [type(v) for v in ft.shape] == [type(v) for v in st.shape]
                        assert ft.numel == st.numel and ft.type == st.type and ft.dtype == st.dtype
        assert block(dt, [4, 8]) != block(dt, [8, 4]) and block(dt, [4, 8]) != block(tl.float64, [4, 8])
        assert not (block(dt, [4, 8]) == block(dt, [4, 8, 1]))
    for bad in ([16.0], [3], [0], [16.0, 2]):  # Triton's refusals, with or without a kept shape of equal value
        with pytest.raises((TypeError, ValueError)):
            block(tl.float32, bad)


def test_fast_unwrap_matches_tritons():
    from triton.language import core

    fast, slow = core._unwrap_if_constexpr, core._unwrap_if_constexpr.__wrapped_original__
    values = [1, 2.5, True, None, "s", tl.float32, tl.pointer_type(tl.int8), tl.constexpr(4), tl.constexpr(tl.int32),
              [tl.constexpr(1), 2], (tl.constexpr(3), 4), core.tuple([tl.constexpr(5), 6])]
    for v in values:
        f, s = fast(v), slow(v)
        assert type(f) is type(s) and (f == s if not isinstance(f, core.tuple) else f.values == s.values), v


@triton.jit
def _chunk_masked(x_ptr, y_ptr, T, NC, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BLOCK)
    m = (o < T) & (pid < NC)  # a block mask and a scalar one: what the GPU compiles, and Triton's interpreter refused
    x = tl.load(x_ptr + pid * BLOCK + o, mask=m, other=-1.0)
    tl.store(y_ptr + pid * BLOCK + o, x * 2.0, mask=m)


def test_a_mask_of_a_block_and_a_scalar_comparison_works_as_on_the_gpu():
    """`(o < T) & (pid < NC)`: Triton's interpreter broadcast the scalar's bool into the compared values' int64 and
    tl.load / tl.store then refused the mask ("mask has unsupported dtype"); a bool now broadcasts as a bool, so the
    program past NC touches nothing and the others their first T entries."""
    x = torch.arange(12, dtype=torch.float32)
    y = torch.full((12,), 7.0)
    _chunk_masked[(3,)](x, y, 3, 2, BLOCK=4)
    want = torch.tensor([0, 2, 4, 7, 8, 10, 12, 7, 7, 7, 7, 7], dtype=torch.float32)
    assert torch.equal(y, want)


def test_the_language_patch_is_replayed_with_the_same_bits_and_restored(monkeypatch):
    """A launch's (and a helper's) language patch is recorded the first time those modules are patched in that state
    and replayed later (no `inspect.getmembers` scan: `_patch_builtin` is not called again); the bits are Triton's
    path's, and after every launch the language is what it was before (the builtins, not interpreter functions)."""
    from triton.runtime import interpreter as it

    assert getattr(it._patch_lang, "_tik_replay", False)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(256, generator=g)
    b = torch.randn(256, generator=g).to(torch.bfloat16)
    i = torch.randint(-1000, 1000, (256,), generator=g, dtype=torch.int32)
    before = {name: getattr(tl, name) for name in ("load", "store", "arange", "sum", "where", "dot")}
    tensor_before = {name: getattr(tl.tensor, name) for name in ("__add__", "__mul__", "to")}
    for _ in range(2):  # the first launches record (a helper may first take Triton's path at the second)
        _run_shapes(x, b, i)
    scans = []
    real = it._patch_builtin
    monkeypatch.setattr(it, "_patch_builtin", lambda *a: (scans.append(a[0]), real(*a))[1])
    fast = [_run_shapes(x, b, i) for _ in range(2)]
    assert scans == []  # replayed: no scan of the language
    assert {n: getattr(tl, n) for n in before} == before
    assert {n: getattr(tl.tensor, n) for n in tensor_before} == tensor_before
    # Triton's own patch: a scan every time, the same bits
    monkeypatch.setattr(it, "_patch_lang", it._patch_lang.__wrapped_original__)
    slow = _run_shapes(x, b, i)
    assert scans  # Triton's patch scanned
    assert {n: getattr(tl, n) for n in before} == before
    for f in fast:
        for a, s in zip(f, slow, strict=True):
            assert torch.equal(a.view(torch.uint8), s.view(torch.uint8))


def _operand(value, dt, shape):
    """An interpreter tensor of dtype dt: a block of `shape`, or a scalar where shape is ()."""
    import numpy as np
    from triton.language import core
    from triton.runtime import interpreter as it

    np_dt = it._get_np_dtype(dt) if hasattr(it, "_get_np_dtype") else None
    data = np.full(shape or (1,), value).astype(np_dt or np.float32)
    return core.tensor(it.TensorHandle(data if shape else data.reshape(()), dt),
                       core.block_type(dt, list(shape)) if shape else dt)


def _outcome(fn, *args):
    """What a binary type check returns (each operand's type, dtype and data) or raises (the exception's type)."""
    import numpy as np

    try:
        out = fn(*args)
    except Exception as e:  # noqa: BLE001 - the exception's type is the outcome
        return ("raises", type(e).__name__)
    return tuple((str(x.type), x.dtype.name, np.asarray(x.handle.data).dtype.str, np.asarray(x.handle.data).shape,
                  np.asarray(x.handle.data).tobytes()) for x in out)


# 1e300 beside an fp32 or fp16 tensor is one of the out-of-range numbers whose handling both paths must share: numpy
# warns as it casts it to inf, on both paths alike
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_fast_binary_type_checks_match_tritons():
    """Every pairing the fast paths take (one dtype at any shapes; a Python number beside a tensor) and their
    neighbours Triton keeps (mixed dtypes, unsigned, bool, out-of-range numbers, a div or mod of narrow floats):
    the same operands out, or the same exception."""
    from triton.language import semantic
    from triton.runtime import interpreter as it

    fast = semantic.TritonSemantic.binary_op_type_checking_impl
    assert getattr(fast, "_tik_fast", False)
    slow = fast.__wrapped_original__
    sem = it.interpreter_semantic
    dtypes = [tl.int32, tl.int64, tl.int8, tl.uint32, tl.int1, tl.float32, tl.bfloat16, tl.float16, tl.float64,
              tl.pointer_type(tl.float32), tl.pointer_type(tl.bfloat16)]
    shapes = [(), (4,), (4, 1), (1, 4), (4, 4)]
    numbers = [0, 3, -5, 2**31 - 1, 2**31, -(2**31) - 1, 2**40, 2.5, -0.0, 1e300, float("nan"), True]
    seen = 0
    for da in dtypes:
        for sa in shapes:
            a = _operand(1, da, sa)
            others = [_operand(2, db, sb) for db in dtypes for sb in shapes] + numbers
            for b in others:
                for arith in (True, False):
                    for div in (False, True):
                        for allow in ((False, False), (True, False), (False, True)):
                            for lhs, rhs in ((a, b), (b, a)):
                                args = (sem, lhs, rhs, *allow, arith, div)
                                assert _outcome(fast, *args) == _outcome(slow, *args), (lhs, rhs, allow, arith, div)
                                seen += 1
    assert seen > 50_000


def test_fast_casts_match_tritons():
    """The casts reduced to one builder call (integers to another width or signedness; bf16 / fp16 -> fp32,
    fp32 -> fp64; fp32 -> bf16 / fp16, fp64 -> fp32) and their neighbours Triton keeps (bool, a rounding mode,
    bf16 -> fp64, floats <-> integers): the same tensor out (type, dtype, bits), or the same exception."""
    from triton.language import semantic
    from triton.runtime import interpreter as it

    fast = semantic.TritonSemantic.cast
    assert getattr(fast, "_tik_fast", False)
    slow = fast.__wrapped_original__
    sem = it.interpreter_semantic
    dtypes = [tl.int8, tl.int16, tl.int32, tl.int64, tl.uint8, tl.uint32, tl.uint64, tl.int1, tl.bfloat16,
              tl.float16, tl.float32, tl.float64]
    values = [0, 1, -1, 3, 200, -70000, 2**31 + 5, 2.5, -0.0, 1e-30, 65519.0, 1e300, float("nan"), float("inf")]
    seen = 0
    with np.errstate(all="ignore"):
        for src in dtypes:
            for shape in [(), (3,), (2, 3)]:
                for v in values:
                    try:
                        x = _operand(v, src, shape)
                    except (OverflowError, ValueError):
                        continue
                    for dst in dtypes:
                        for rounding in (None, "rtne", "rtz"):
                            args = (sem, x, dst, rounding)
                            got = _outcome(lambda *a: (fast(*a),), *args)
                            assert got == _outcome(lambda *a: (slow(*a),), *args), (src, dst, shape, v, rounding)
                            seen += 1
    assert seen > 5_000
