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


def pytest_configure(config):
    # Where the kernel refuses the sandbox's namespaces, the sandbox's own tests skip (saying why) and every
    # other test runs its children unconfined, as `--unsafe-no-sandbox` would; the header says which.
    import os

    from tik_kernels.evaluator import sandbox

    mode, why = sandbox.availability()
    if mode is None:
        os.environ[sandbox.UNSAFE_ENV] = "1"
    config.tik_sandbox = f"on (uid mode {mode})" if mode else f"REFUSED here ({why}): children run unconfined"


def pytest_report_header(config):
    return f"tik sandbox: {config.tik_sandbox}"
