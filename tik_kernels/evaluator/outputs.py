"""What the child checks of an implementation's outputs before anything leaves its process, and the one-line form
of an exception: shared by the probe runner (`child.py`), the timing harness (`timing.py`) and the evidence job
(`evidence.py`), which `child.py` starts, so they live here and not in `child.py`."""

from __future__ import annotations

from typing import Any


def one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:300] if msg else type(e).__name__


def check_outputs(out: Any, args: tuple, kwargs: dict, device: str) -> None:
    import torch

    items = list(out) if isinstance(out, (tuple, list)) else [out]
    inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    in_ptrs = {a.untyped_storage().data_ptr() for a in inputs if a.numel()}
    for i, t in enumerate(items):
        if type(t) is not torch.Tensor:
            raise TypeError(f"output {i} is {type(t).__name__}, not a plain torch.Tensor")
        if t.layout != torch.strided or t.is_meta:
            raise TypeError(f"output {i} is not a dense strided tensor")
        if t.device.type != torch.device(device).type:
            raise TypeError(f"output {i} is on {t.device}, expected {device}")
        if not t.is_contiguous():
            raise TypeError(f"output {i} is not contiguous (shape {tuple(t.shape)}, strides {t.stride()})")
        if t.numel() and (t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.numel() * t.element_size()):
            raise TypeError(f"output {i} is a view into a larger buffer")
        if t.numel() and t.untyped_storage().data_ptr() in in_ptrs:
            raise TypeError(f"output {i} aliases an input")
