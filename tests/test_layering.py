"""The layering in docs/ARCHITECTURE.md, enforced: tik_kernels/ and tik_store/ never import textual or anthropic;
tik_store/ never imports torch or triton; the agent never imports textual."""

import subprocess
import sys

import pytest

RULES = [
    ("tik_kernels", ("textual", "anthropic")),
    ("tik_kernels.contracts", ("textual", "anthropic", "tik_store", "tik_tui")),
    ("tik_store", ("textual", "anthropic", "torch", "triton")),
    ("tik_tui.agent", ("textual",)),
]


@pytest.mark.parametrize("module,forbidden", RULES, ids=[r[0] for r in RULES])
def test_layering(module, forbidden):
    code = (
        "import importlib, pkgutil, sys\n"
        f"m = importlib.import_module({module!r})\n"
        "for info in pkgutil.walk_packages(getattr(m, '__path__', []), m.__name__ + '.'):\n"
        "    importlib.import_module(info.name)\n"
        f"bad = sorted({{n.split('.')[0] for n in sys.modules}} & set({forbidden!r}))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"


def _imported_roots(path):
    import ast

    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


def test_no_import_of_colliding_names():
    """PyPI's `kernels` (a transformers 5 dependency), `store` and `tik` must never be what TIK imports."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    bad = []
    for folder in ("tik_kernels", "tik_store", "tik_tui", "tests", "benchmarks"):
        for path in (root / folder).rglob("*.py"):
            names = set(_imported_roots(path)) & {"kernels", "store", "tik"}
            if names:
                bad.append(f"{path.relative_to(root)}: {sorted(names)}")
    assert not bad, bad


def test_beside_huggingface_kernels():
    """With transformers and Hugging Face's `kernels` package imported first, TIK's kernels still run."""
    pytest.importorskip("transformers")
    pytest.importorskip("kernels")
    code = (
        "import kernels, transformers\n"
        "import torch\n"
        "import tik_kernels.ops.rmsnorm as r\n"
        "x = torch.randn(3, 16, dtype=torch.bfloat16); w = torch.ones(16, dtype=torch.bfloat16)\n"
        "assert r.rmsnorm(x, w, 1e-6).shape == (3, 16)\n"
        "assert 'site-packages' in kernels.__file__ or 'dist-packages' in kernels.__file__, kernels.__file__\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
