"""README figures against their results files: benchmarks/results/MANIFEST.json names, for every figure the README
(or the measurement log it moved to, docs/MEASUREMENTS.md) quotes, the file it comes from and the key or line; a
quoted figure cannot drift from its file unnoticed."""

import copy
import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "benchmarks" / "results" / "MANIFEST.json"
#: the documents whose figures the manifest covers: the README and the measurement log its history moved to
DOCUMENTS = ("README.md", "docs/MEASUREMENTS.md")


def documents() -> str:
    return "\n\n".join((ROOT / name).read_text() for name in DOCUMENTS)


def squash(text: str) -> str:
    """Whitespace runs as one space: README paragraphs wrap anywhere."""
    return re.sub(r"\s+", " ", text)


def lookup(doc, path: list):
    """The value at path, None where it is missing; '*' maps the rest of the path over every element of a list
    or dict and gives the list of what is found (flattened when the rest holds another '*')."""
    if not path:
        return doc
    head, rest = path[0], path[1:]
    if head == "*":
        items = doc.values() if isinstance(doc, dict) else doc if isinstance(doc, list) else []
        out = []
        for item in items:
            v = lookup(item, rest)
            if v is not None:
                out.extend(v if "*" in rest else [v])
        return out
    if isinstance(doc, list):
        nxt = doc[head] if isinstance(head, int) and -len(doc) <= head < len(doc) else None
    else:
        nxt = doc.get(head) if isinstance(doc, dict) else None
    return None if nxt is None else lookup(nxt, rest)


def aggregate(values, agg: str | None):
    if agg is None:
        return values
    if agg == "geomean":
        return math.exp(sum(math.log(v) for v in values) / len(values))
    if agg == "sum":
        return sum(values)
    if agg in ("min", "max"):
        return min(values) if agg == "min" else max(values)
    if agg.startswith("count_le:"):
        return sum(v <= float(agg.split(":", 1)[1]) for v in values)
    if agg == "max_abs_pct_from_1":
        return 100 * max(abs(v - 1) for v in values)
    if agg == "giga":
        return values / 1e9
    if agg == "len":
        return len(values)
    raise ValueError(f"unknown agg {agg!r}")


_PARSED: dict = {}


def parsed(path: Path):
    """A results file's JSON, parsed once per (path, mtime): some are megabytes, read by many checks."""
    key = (path, path.stat().st_mtime_ns)
    if key not in _PARSED:
        _PARSED[key] = json.loads(path.read_text())
    return _PARSED[key]


def problems(entry: dict, readme: str, root: Path = ROOT) -> list[str]:
    """What is wrong with one manifest entry against README text and the files under root; [] when all agree."""
    out = []
    excerpt = squash(entry["readme"])
    if excerpt not in squash(readme):
        out.append(f"{entry['id']}: README does not contain {entry['readme']!r}")
    if not entry.get("command"):
        out.append(f"{entry['id']}: no producing command")
    for check in entry["checks"]:
        path = root / check.get("file", entry["file"])
        if not path.is_file():
            out.append(f"{entry['id']}: no file {path.relative_to(root)}")
            continue
        fig = check.get("figure")
        if fig is not None and squash(fig) not in excerpt:
            out.append(f"{entry['id']}: figure {fig!r} is not in its README excerpt")
        if "text" in check:
            text = path.read_text()
            if check["text"] not in text:
                out.append(f"{entry['id']}: {path.name} has no line with {check['text']!r}")
            elif fig is not None and fig not in check["text"]:
                out.append(f"{entry['id']}: figure {fig!r} is not in the file's line {check['text']!r}")
            continue
        value = lookup(parsed(path), check["key"])
        if value is None or value == []:
            out.append(f"{entry['id']}: {path.name} has no {check['key']}")
            continue
        value = aggregate(value, check.get("agg"))
        if "equals" in check:
            if value != check["equals"]:
                out.append(f"{entry['id']}: {path.name} {check['key']} is {value!r}, not {check['equals']!r}")
        elif check["format"].format(value) != fig:
            out.append(f"{entry['id']}: {path.name} {check['key']} gives {check['format'].format(value)!r}, "
                       f"README says {fig!r}")
    return out


def load() -> dict:
    return json.loads(MANIFEST.read_text())


def test_manifest_figures_match_their_files():
    readme = documents()
    found = [p for e in load()["figures"] for p in problems(e, readme)]
    assert not found, "\n".join(found)


def test_manifest_ids_unique_and_headline_covered():
    ids = [e["id"] for e in load()["figures"]]
    assert len(ids) == len(set(ids))
    # the README's opening claim is a saved figure, not a number from nowhere
    assert "headline_stock_mismatch" in ids


def test_readme_result_links_exist():
    """Every results file the README names (`name.md`, `archive/name.md`, globs) exists under benchmarks/results."""
    readme = documents()
    results = ROOT / "benchmarks" / "results"
    pending = load().get("pending", {})  # named before their command has run (MANIFEST.json says why)
    missing = []
    for name in set(re.findall(r"`((?:archive/)?[\w*.-]+\.(?:md|json|log|csv|png|txt))`", readme)):
        if name.startswith(("README", "INTERFACES")) or "/" in name.replace("archive/", "") or name in pending:
            continue
        if not list(results.glob(name)) and not list(ROOT.glob(name)):
            missing.append(name)
    assert not missing, missing


@pytest.fixture
def entry():
    return copy.deepcopy(next(e for e in load()["figures"] if e["id"] == "headline_stock_mismatch"))


def test_checker_catches_a_drifted_readme(entry):
    readme = documents()
    assert problems(entry, readme) == []
    assert problems(entry, readme.replace("562 of 24,790", "29 of 1,536"))  # the old, unsourced headline


def test_checker_catches_a_drifted_file(entry, tmp_path):
    readme = documents()
    src = ROOT / entry["file"]
    doc = json.loads(src.read_text())
    doc["throughput"]["qwen3-1.7b"]["modes"]["A"]["equal_tokens"] = 600  # a rerun that nobody copied to the README
    (tmp_path / src.relative_to(ROOT)).parent.mkdir(parents=True)
    (tmp_path / src.relative_to(ROOT)).write_text(json.dumps(doc))
    assert any("README says '562'" in p for p in problems(entry, readme, root=tmp_path))
    entry["checks"][0]["key"] = ["throughput", "qwen3-1.7b", "modes", "A", "no_such_key"]
    assert any("has no" in p for p in problems(entry, readme))


def test_checker_text_and_aggregates():
    e = {"id": "x", "readme": "geomean 2.00× over 3 cells", "file": "f.json", "command": "c",
         "checks": [{"key": ["r", "*", "v"], "agg": "geomean", "format": "{:.2f}×", "figure": "2.00×"},
                    {"key": ["r", "*", "v"], "agg": "count_le:4", "format": "{} cells", "figure": "3 cells"}]}
    root = Path(__file__).parent / "_manifest_tmp_unused"
    assert lookup({"r": [{"v": 1.0}, {"v": 4.0}]}, ["r", "*", "v"]) == [1.0, 4.0]
    assert aggregate([1.0, 4.0], "geomean") == pytest.approx(2.0)
    assert problems(e, "geomean 2.00× over 3 cells", root=root)  # the file does not exist: reported, not passed
