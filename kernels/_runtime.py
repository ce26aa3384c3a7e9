"""Where kernels run: a CUDA GPU, or Triton's interpreter on the CPU.

Imported by `kernels/__init__.py` before anything imports Triton, because Triton reads
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


def default_device() -> str:
    return DEVICE
