"""Test-wide set-up. Importing `kernels` first sets TRITON_INTERPRET=1 on machines without a GPU,
before anything imports Triton."""

import pytest
import torch

import tik_kernels  # noqa: F401  (must precede any triton import)


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
