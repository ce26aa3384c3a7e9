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


if INTERPRET:
    _order_defined_interpreter_dot()
    _helpers_without_repatching()
