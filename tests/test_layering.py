"""The layering in docs/ARCHITECTURE.md, enforced: tik_kernels/ and tik_store/ never import textual or anthropic;
tik_store/ never imports torch or triton; the agent never imports textual; no import cycles among the repo's own
modules."""

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


# ----------------------------------------------------------------------------- import cycles

#: the repo's own packages, whose modules must import each other without a cycle
OWN = ("tik_kernels", "tik_store", "tik_tui", "benchmarks")


def _import_graph(root, folders=OWN) -> dict[str, set[str]]:
    """{module: the own modules it imports}, every import statement counted, at module level or inside a
    function (a lazy import still ties the two modules together). `from a import b` imports a.b when that is a
    module, else a; a package's parents, which Python runs first, are not counted (they would make every
    package whose __init__ re-exports its modules a cycle)."""
    import ast

    files = {}
    for folder in folders:
        for path in (root / folder).rglob("*.py"):
            if "results" in path.relative_to(root).parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    base = f"{parent}.{base}" if base else parent
                for a in node.names:
                    if f"{base}.{a.name}" in files:
                        deps.add(f"{base}.{a.name}")
                    elif base in files:
                        deps.add(base)
        graph[name] = deps - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every module of one
    reaches every other through imports."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on_stack.discard(comp[-1])
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _describe(graph, cycles) -> str:
    """Each cycle's modules, then every import between two of them."""
    return "\n".join(f"cycle of {len(c)} modules ({', '.join(c)}):\n"
                     + "\n".join(f"    {a} -> {b}" for a in c for b in sorted(graph[a] & set(c))) for c in cycles)


def test_no_import_cycles():
    from pathlib import Path

    graph = _import_graph(Path(__file__).resolve().parent.parent)
    assert {"tik_kernels.contract", "tik_store.workspace", "tik_tui.agent.loop", "benchmarks.harness"} <= graph.keys()
    cycles = _cycles(graph)
    print(_describe(graph, cycles))
    assert not cycles, "import cycles among the repo's own modules:\n" + _describe(graph, cycles)


def test_a_planted_cycle_is_found(tmp_path):
    pkg = tmp_path / "tik_store"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from tik_store.a import A\n")  # a parent package: not a cycle
    (pkg / "a.py").write_text("A = 1\n\ndef f():\n    from tik_store import b  # inside a function, as a.b\n")
    (pkg / "b.py").write_text("from .a import A\n")
    (pkg / "c.py").write_text("import tik_store.b\n")
    graph = _import_graph(tmp_path, ("tik_store",))
    assert graph["tik_store.a"] == {"tik_store.b"} and graph["tik_store.c"] == {"tik_store.b"}
    assert _cycles(graph) == [["tik_store.a", "tik_store.b"]]
    (pkg / "a.py").write_text("A = 1\n")
    assert _cycles(_import_graph(tmp_path, ("tik_store",))) == []
