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


_PDL_DEVICES: dict = {}


def pdl_capable(device: torch.device) -> bool:
    """Programmatic dependent launch works here: a CUDA device of compute capability 9.0 or more (Hopper) and a Triton
    that has the launch option and both instructions; never in the interpreter (tik_kernels/ops/_common.py: the
    operators' PDL launch; tik_kernels/contract/late.py: the probes' late inputs)."""
    if INTERPRET or device.type != "cuda":
        return False
    if device not in _PDL_DEVICES:
        import triton.language as tl

        cuda = getattr(getattr(tl, "extra", None), "cuda", None)
        _PDL_DEVICES[device] = (torch.cuda.get_device_capability(device)[0] >= 9
                                and hasattr(cuda, "gdc_wait") and hasattr(cuda, "gdc_launch_dependents"))
    return _PDL_DEVICES[device]


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (read once per device); DEFAULT_SMS off the GPU."""
    if device.type != "cuda":
        return DEFAULT_SMS
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


if INTERPRET:
    # Triton's interpreter adjusted before any kernel runs (tik_kernels/_interpreter.py)
    from tik_kernels import _interpreter

    _interpreter.install()
