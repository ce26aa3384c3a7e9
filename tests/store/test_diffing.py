"""tik_store.diffing: its one-split source segments are exactly `ast.get_source_segment`'s, on every library
operator file and on sources with CRLF and CR line ends, form feeds, non-ASCII text, decorators and methods."""

import ast
from pathlib import Path

import pytest

from tik_store import diffing

OPS = sorted((Path(__file__).resolve().parents[2] / "tik_kernels" / "ops").glob("*.py"))
ODD = [
    "import x\r\nCONFIG = {'é': 1}\r\n\r\n@dec(\r\n  2)\r\ndef f(a):\r\n    return 'ü' + a\r\n",
    "A = 1\rclass K:\r    def m(self):\r        return 'ß'\r    x = 2\r",
    "A = 1\n\x0c\ndef g():\n    '''\x0c form feed'''\n    return 1\n\n"
    "class C(B):\n    @property\n    def p(self): return 'λ'\n",
    "x = 1",
    "",
]


def reference(source: str) -> dict[str, str]:
    """`_definitions` written with ast.get_source_segment (what it did before the one-split segments)."""
    tree = ast.parse(source)
    defs, rest = {}, []
    for node in tree.body:
        text = ast.get_source_segment(source, node) or ""
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defs[node.name] = "".join(ast.get_source_segment(source, d) or "" for d in node.decorator_list) + text
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                        defs[f"{node.name}.{sub.name}"] = ast.get_source_segment(source, sub) or ""
        else:
            rest.append(text)
    defs["<module>"] = "\n".join(rest)
    return defs


@pytest.mark.parametrize("source", [p.read_text() for p in OPS] + ODD, ids=[p.name for p in OPS] +
                         [f"odd{i}" for i in range(len(ODD))])
def test_segments_are_the_standard_librarys(source):
    assert diffing._definitions(source) == reference(source)


def test_functions_changed_names_the_edited_definitions():
    old = "CONFIG = {'B': 1}\n\ndef f():\n    return 1\n\nclass K:\n    def m(self):\n        return 2\n"
    new = old.replace("return 2", "return 3").replace("'B': 1", "'B': 2")
    assert diffing.functions_changed(old, new) == ["K", "K.m", "<module>"]
    assert diffing.functions_changed(old, old) == []
