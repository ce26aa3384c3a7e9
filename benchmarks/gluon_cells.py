"""What bench_gluon_fwd.py and bench_gluon_linear.py do alike: each cell's bits gate over the Gluon forms, their
timing beside the root and the stock path (benchmarks/harness.py's `compare`: CUDA-graph replay on rotating input
copies, interleaved rounds, medians), and the report (JSON and a markdown table of times and ratios to stock)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from benchmarks import harness as H


def gate(row: dict, forms: dict[str, Callable], inputs: tuple, want, differ: Callable, differ_key: str) -> dict:
    """Run every form on `inputs` against the root's output `want` (bits, `H.tree_bits_equal`): a form that raises or
    gives other bits turns the row red (`row["red"]`, with the error or `differ(got, want)` under
    `<form>_<differ_key>`).
    Returns the forms to time: every one that ran, other bits or not (how fast a schedule is says whether its bits
    are worth fixing)."""
    timed = {}
    for name, fn in forms.items():
        try:
            got = fn(*inputs)
        except Exception as e:  # a form that cannot run here is a finding, not the end of the run
            row["bits"] = False
            row.setdefault("red", []).append(name)
            row[f"{name}_error"] = H.one_line(e)
            continue
        if not H.tree_bits_equal(got, want):
            row["bits"] = False
            row.setdefault("red", []).append(name)
            row[f"{name}_{differ_key}"] = differ(got, want)
        timed[name] = fn
    return timed


def time_cell(row: dict, contenders: dict[str, Callable], inputs: tuple, stock: str, rounds: int, **work) -> dict:
    """Every contender timed in the same rounds; `row` gets each one's median (`<name>_us`), error, and ratio to the
    `stock` contender's median (`<name>_ratio`, lower is faster). Returns compare's contenders; prints the row."""
    c = H.compare(contenders, inputs, rounds=rounds, **work)["contenders"]
    base = c[stock].get("median_us")
    for n in contenders:
        row[f"{n}_us"] = c[n].get("median_us")
        if c[n].get("error"):
            row[f"{n}_error"] = c[n]["error"]
        if base and n != stock and c[n].get("median_us"):
            row[f"{n}_ratio"] = c[n]["median_us"] / base
    return c


def show(row: dict) -> None:
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def report(out: Path, stem: str, device: str, rows: list[dict], names: tuple, stock: str, over: list[dict],
           title: str, notes: list[str], geomean_label: str) -> int:
    """Write <stem>.json (the rows, each name's geomean ratio over the rows `over`, whether every row is green) and
    <stem>.md; 0 when every form gave the root's bits everywhere, else 1."""
    doc = {"env": H.environment(device), "command": H.command_line(), "rows": rows,
           **{f"{n}_geomean": H.geomean(r.get(f"{n}_ratio") for r in over) for n in names},
           "bits_all": all(r["bits"] for r in rows)}
    out.mkdir(parents=True, exist_ok=True)
    H.write_json(out / f"{stem}.json", doc)
    lines = [f"# {title} ({doc['env'].get('gpu') or device})", "", f"`{doc['command']}`", "", *notes, "",
             f"Geomean over {geomean_label}: " + ", ".join(f"{n} {_fmt(doc[n + '_geomean'])}" for n in names)
             + f"; bits everywhere: {doc['bits_all']}", "",
             "| cell | bits | " + " | ".join(f"{n} µs" for n in (*names, stock)) + " | "
             + " | ".join(f"{n} ratio" for n in names) + " |", "|---|---|" + "---|" * (2 * len(names) + 1)]
    for r in rows:
        bits = "green" if r["bits"] else "red: " + ", ".join(r["red"])
        lines.append(f"| {r['cell']} | {bits} | " + " | ".join(_fmt(r.get(f"{n}_us")) for n in (*names, stock))
                     + " | " + " | ".join(_fmt(r.get(f"{n}_ratio")) for n in names) + " |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}/{stem}.json, .md", flush=True)
    return 0 if doc["bits_all"] else 1
