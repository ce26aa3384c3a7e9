"""A candidate's cells as a heatmap: one row per workload (model/phase), one column per size, each square
the time ratio to the root (against that cell's limit) or to the incumbent, coloured.

                                 T=1     T=8    T=64   T=256  T=1024
    qwen3-8b/hidden/decode     0.912   0.934  1.143!  0.970       ·
    qwen3-8b/hidden/train          ·       ·       ·       ·  0.981

Green is faster, grey about even, yellow slower but within the limit, red beyond it (marked `!`, so the
picture reads without colour too)."""

from __future__ import annotations

import re

from rich.text import Text

from tik_tui.verdict import cell_limit, cell_ratio, cell_vs_incumbent

#: (lower bound of the ratio, background): faster is greener
_FASTER = ((0.80, "#1e6b2e"), (0.90, "#2f7d3c"), (0.97, "#3f6f45"), (0.995, "#4a5a4c"))
_EVEN = "#4a4a4a"
_SLOWER = "#7a6a1e"
_OVER = "#9b2226"


def split_cell(name: str) -> tuple[str, list[str]]:
    """(workload, size parameters): `qwen3-8b/decode[T=1,H=4096]` -> (`qwen3-8b/decode`, [`T=1`, `H=4096`]);
    `o[N=4096,K=4096]/M=8` -> (`o[N=4096,K=4096]`, [`M=8`]). A name of neither shape is its own workload."""
    m = re.fullmatch(r"(.+)\[([^\]]*)\]", name)
    if m:
        return m.group(1), m.group(2).split(",")
    head, sep, tail = name.rpartition("/")
    return (head, [tail]) if sep else (name, [""])


def _columns(cells: list[dict]) -> list[tuple[str, str, dict]]:
    """(workload, size label, cell): the label keeps only the parameters that vary within the workload
    (`T=64`, not `T=64,H=4096`; `B=4,S=1024` where both vary)."""
    parsed = [(*split_cell(str(c.get("cell"))), c) for c in cells]
    by_work: dict[str, list[list[str]]] = {}
    for work, params, _ in parsed:
        by_work.setdefault(work, []).append(params)
    keep: dict[str, list[int]] = {}
    for work, plist in by_work.items():
        n = min(len(p) for p in plist)
        varying = [i for i in range(n) if len({p[i] for p in plist}) > 1]
        keep[work] = varying or [0]
    return [(work, ",".join(p[i] for i in keep[work] if i < len(p)), c) for work, p, c in parsed]


def colour(ratio: float, limit: float | None) -> str:
    if limit is not None and ratio > limit:
        return _OVER
    if ratio > 1.005:
        return _SLOWER
    for bound, bg in _FASTER:
        if ratio < bound:
            return bg
    return _EVEN


def heatmap(cells: list[dict], *, against: str = "root", width: int = 100) -> Text:
    """The map of `cells` against `root` (each cell's limit applies) or `incumbent` (no limit: colour alone).
    Rows are workloads, columns the sizes in the order the contract lists them; `·` where a workload has no
    cell of that size."""
    ratio_of = cell_ratio if against == "root" else cell_vs_incumbent
    if not any(ratio_of(c) is not None for c in cells):
        return Text(f"no timings against the {against} yet", style="dim")
    grid: dict[str, dict[str, dict]] = {}
    sizes: list[str] = []
    for work, size, c in _columns(cells):
        grid.setdefault(work, {})[size] = c
        if size not in sizes:
            sizes.append(size)
    label_w = min(max(len(w) for w in grid), 34)
    col_w = [max(len(s), 6) + 1 for s in sizes]
    # as many columns as fit; the rest continue in a second band below
    bands, band, used = [], [], label_w + 1
    for k, w in enumerate(col_w):
        if band and used + w + 1 > width:
            bands.append(band)
            band, used = [], label_w + 1
        band.append(k)
        used += w + 1
    bands.append(band)
    out = Text()
    for band in bands:
        out.append(" " * (label_w + 1))
        for k in band:
            out.append(f"{sizes[k]:>{col_w[k]}} ", style="dim")
        out.append("\n")
        for work, row in grid.items():
            label = work if len(work) <= label_w else "…" + work[-(label_w - 1):]
            out.append(f"{label:<{label_w}} ", style="bold")
            for k in band:
                c = row.get(sizes[k])
                r = None if c is None else ratio_of(c)
                if r is None:
                    out.append(f"{'·' if c is None else '—':>{col_w[k]}} ", style="dim")
                    continue
                # only the root has limits; against the incumbent, colour alone says slower
                lim = cell_limit(c) if against == "root" else None
                mark = "!" if lim is not None and r > lim else " "
                out.append(f"{r:>{col_w[k] - 1}.3f}{mark}", style=f"white on {colour(r, lim)}")
                out.append(" ")
            out.append("\n")
    return out


def legend(cells: list[dict]) -> Text:
    limits = sorted({round(lim, 4) for c in cells if (lim := cell_limit(c)) is not None})
    lim = "/".join(f"{v:.2f}×" for v in limits) or "—"
    t = Text("time ratio per cell, below 1 is faster ", style="dim")
    for label, bg in (("faster", _FASTER[1][1]), ("even", _EVEN), ("slower", _SLOWER), ("over limit!", _OVER)):
        t.append(f" {label} ", style=f"white on {bg}")
        t.append(" ")
    t.append(f" limit {lim} root", style="dim")
    return t


def cell_maps(cells: list[dict], width: int = 100) -> Text:
    """Both maps with their titles and the legend: what the detail view and the queue show."""
    t = Text()
    t.append_text(legend(cells)).append("\n\n")
    t.append("vs root\n", style="bold underline")
    t.append_text(heatmap(cells, against="root", width=width)).append("\n")
    t.append("vs incumbent (same run)\n", style="bold underline")
    t.append_text(heatmap(cells, against="incumbent", width=width))
    return t
