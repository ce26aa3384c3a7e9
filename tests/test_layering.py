"""The layering in DESIGN.md, enforced: kernels/ and store/ never import textual or anthropic;
store/ never imports torch or triton; the agent never imports textual."""

import subprocess
import sys

import pytest

RULES = [
    ("kernels", ("textual", "anthropic")),
    ("kernels.contracts", ("textual", "anthropic", "store", "tik_tui")),
    ("store", ("textual", "anthropic", "torch", "triton")),
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
