"""Where kernels run: a CUDA GPU, or Triton's interpreter on the CPU.

Imported by `tik_kernels/__init__.py` before anything imports Triton, because Triton reads
TRITON_INTERPRET at import time. On a machine without a GPU TIK sets it itself.
"""

from __future__ import annotations

import os

import torch

HAS_GPU: bool = torch.cuda.is_available()

if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

#: True when Triton kernels run in the CPU interpreter (no GPU bits are meaningful there).
INTERPRET: bool = os.environ.get("TRITON_INTERPRET") == "1"

#: Device the library's tensors live on by default.
DEVICE: str = "cuda" if HAS_GPU and not INTERPRET else "cpu"

#: SMs assumed without a GPU (the H200's), so the interpreter takes the GPU's launch decisions
DEFAULT_SMS = 132

_SMS: dict = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (read once per device); DEFAULT_SMS off the GPU."""
    if device.type != "cuda":
        return DEFAULT_SMS
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


def _order_defined_interpreter_dot() -> None:
    """Make the interpreter's `tl.dot` sum over K in order, the same for every tile shape.

    Triton's interpreter computes a dot with `np.matmul`, whose summation order is the BLAS
    library's and follows the matrix shape: on an AMD EPYC host (OpenBLAS 0.3.31) a 1-row product
    differed from the same row inside a 2-, 3- or 5-row one, so the CPU contract tests' bitwise
    checks (batch invariance, tile changes that must not change bits) failed or passed with the
    machine. Here every output element is `sum_k a[m, k] * b[k, n]`, added k = 0, 1, ... in fp32
    (one rounding per product and per add), then `+ acc`: a function of that element's row and
    column alone, as a K-sequential GPU dot is. Integer and fp8 dots keep Triton's own path
    (integer sums are exact; fp8 never reaches it in TIK).
    """
    import numpy as np
    from triton.runtime import interpreter as it

    original = it.InterpreterBuilder.create_dot
    if getattr(original, "_tik_order_defined", False):
        return

    def as_float(h, dtype):
        if h.dtype.scalar.is_bf16():
            return (h.data.astype(np.uint32) << 16).view(np.float32).astype(dtype)
        return h.data.astype(dtype)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        out = d.data.dtype
        floats = (a.dtype.scalar.is_floating() and b.dtype.scalar.is_floating() and np.issubdtype(out, np.floating)
                  and a.dtype.scalar.primitive_bitwidth > 8 and b.dtype.scalar.primitive_bitwidth > 8)
        if not floats:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        x, y = as_float(a, out), as_float(b, out)
        acc = x[..., :, 0:1] * y[..., 0:1, :]
        for k in range(1, x.shape[-1]):
            acc += x[..., :, k:k + 1] * y[..., k:k + 1, :]
        return it.TensorHandle(acc + d.data, d.dtype.scalar)

    create_dot._tik_order_defined = True
    it.InterpreterBuilder.create_dot = create_dot
    it.interpreter_builder.create_dot = create_dot.__get__(it.interpreter_builder)


def _helpers_without_repatching() -> None:
    """Stop Triton's interpreter from patching `triton.language` again at every call of a `@triton.jit` helper.

    A launch (`GridExecutor.__call__`) patches the language modules its kernel sees (tl, tl.core: their builtins
    become interpreter functions) and keeps them so until it returns. Each call of a helper from inside the kernel
    (`InterpretedFunction.__call__`) then patches them again (`_patch_lang`: an `inspect.getmembers` scan of tl,
    tl.tensor, tl.math, ~1.4 ms), replacing patched members with equivalent ones and never restoring them: the
    attention root's CPU probes made 19,545 such calls. Here a helper whose language modules are patched already in
    the running launch (by the launch, or by an earlier helper call, which Triton never undoes) is called without
    that scan; anything else (the first helper of a launch that sees another module, a call outside a launch) takes
    Triton's own path. Installed only when Triton's helper
    call still has the shape this replaces (else Triton is left alone); the results are the same bits (the patched
    functions are the same), which the CPU contract tests check."""
    import inspect

    from triton.runtime import interpreter as it

    grid_call, helper_call = it.GridExecutor.__call__, it.InterpretedFunction.__call__
    if getattr(helper_call, "_tik_once", False):
        return
    try:
        body = inspect.getsource(helper_call)
    except (OSError, TypeError):
        return
    if "_patch_lang(self.fn)" not in body or "self.rewrite()" not in body or not hasattr(it, "InterpreterError"):
        return
    langs = (it.tl, it.tl.core)
    patched: list[set] = []  # the language modules patched for each launch in progress (innermost last)
    seen: dict = {}

    def modules(fn) -> frozenset:
        key = id(fn)
        if key not in seen:
            seen[key] = (fn, frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in langs))
        return seen[key][1]

    def launch(self, *args, **kwargs):
        patched.append(set(modules(self.fn)))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    def call(self, *args, **kwargs):
        if not patched or not modules(self.fn) <= patched[-1]:
            # Triton's path patches this helper's modules and never restores them: from now on in this launch they
            # are patched too (Triton's standard library, tl.sum and the like, sees tl.core where a kernel sees tl)
            if patched:
                patched[-1] |= modules(self.fn)
            return helper_call(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise it.InterpreterError(repr(e)) from e

    call._tik_once = True
    call.__wrapped_original__, launch.__wrapped_original__ = helper_call, grid_call  # Triton's own, for the tests
    it.GridExecutor.__call__ = launch
    it.InterpretedFunction.__call__ = call


def _no_discarded_overflow_checks() -> None:
    """Stop the interpreter from computing integer-overflow checks it then throws away.

    With `sanitize_overflow` on (the interpreter's default), every integer add, sub and mul in a kernel (index and
    pointer arithmetic, mostly) is done a second time in int64 with two comparisons and an `and`, to feed
    `device_assert`; and `device_assert` returns at once unless `debug` is on, which the interpreter's options never
    set. On the GPU the same assert is compiled out without `debug`. So the check is work with no effect: the attention
    root's CPU probes spent ~20% of their time in it. Turned off only while the options say `debug` is off and
    Triton's assert still has that shape (else Triton is left alone); the kernels' values are the same bits."""
    import dataclasses
    import inspect

    from triton.language import semantic
    from triton.runtime import interpreter as it

    builder = getattr(it, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    cls = getattr(semantic, "TritonSemantic", None)
    if options is None or options.debug or not getattr(options, "sanitize_overflow", False) or cls is None:
        return
    try:
        asserts = inspect.getsource(cls.device_assert)
        sanitize = inspect.getsource(cls.binary_op_sanitize_overflow_impl)
    except (AttributeError, OSError, TypeError):
        return
    if "if not self.builder.options.debug" not in asserts or "self.device_assert(" not in sanitize:
        return
    builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _fast_interpreter_types() -> None:
    """Two of the interpreter's per-operation helpers made cheap, with the same results.

    `_get_np_dtype` (Triton type -> numpy dtype) builds a 19-entry dict at every call, ~180,000 calls in the attention
    root's CPU probes: here its answer is kept per element type. `_convert_float` turns bf16 to fp32 and back through a
    general bit-field routine for every cast; for the casts TIK's kernels make (bf16 <-> fp32, no rounding mode given),
    when no input is subnormal, that routine's result is the plain bit shift (bf16 -> fp32: the 16 bits moved up;
    fp32 -> bf16: the top 16 bits, truncated as Triton's routine does), so that case takes the shift and any other goes
    to Triton's routine (which treats subnormals its own way). `tests/kernels/test_interpreter_patches.py` checks both
    against Triton's own functions: every bf16 value, and fp32 values of every exponent."""
    import inspect

    import numpy as np
    from triton.runtime import interpreter as it

    tl = it.tl
    np_dtype, convert = getattr(it, "_get_np_dtype", None), getattr(it, "_convert_float", None)
    if np_dtype is None or convert is None or getattr(np_dtype, "_tik_fast", False):
        return
    try:
        body = inspect.getsource(convert)
    except (OSError, TypeError):
        return
    if "def _convert_float(input, input_dtype, output_dtype, rounding_mode)" not in body:
        return
    u64 = np.dtype(np.uint64)
    by_name: dict = {}

    def get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, tl.pointer_type):
            return u64
        found = by_name.get(tt_dtype.name)
        if found is None:
            found = by_name[tt_dtype.name] = np_dtype(tt_dtype)
        return found

    bf16, fp32 = tl.bfloat16, tl.float32

    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        if rounding_mode is None and input_dtype == bf16 and output_dtype == fp32:
            bits = np.asarray(input).view(np.uint16)
            if not (((bits & 0x7F80) == 0) & ((bits & 0x007F) != 0)).any():
                return bits.astype(np.uint32) << np.uint32(16)
        elif rounding_mode is None and input_dtype == fp32 and output_dtype == bf16:
            bits = np.asarray(input).view(np.uint32)
            if not (((bits & 0x7F800000) == 0) & ((bits & 0x007FFFFF) != 0)).any():
                return (bits >> np.uint32(16)).astype(np.uint16)
        return convert(input, input_dtype, output_dtype, rounding_mode)

    get_np_dtype._tik_fast = convert_float._tik_fast = True
    get_np_dtype.__wrapped_original__, convert_float.__wrapped_original__ = np_dtype, convert
    it._get_np_dtype, it._convert_float = get_np_dtype, convert_float


if INTERPRET:
    _order_defined_interpreter_dot()
    _helpers_without_repatching()
    _no_discarded_overflow_checks()
    _fast_interpreter_types()
