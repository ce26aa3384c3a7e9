"""The Gluon small-batch linear (tik_kernels/experimental/gluon_linear_small.py) timed against the linear root and
cuBLAS at bench_speed's M <= 16 cells (Qwen3-8B's projections and lm_head at M = 1, 4, 16) and, for the unswapped
form, the projections at M = 64 (a decode batch), each cell behind a bits gate (the Gluon product equal to the
root's).

    PYTHONPATH=. python benchmarks/bench_gluon_linear.py --out benchmarks/results [--rounds 9]

Contenders in the same interleaved rounds (benchmarks/harness.py: CUDA-graph replay on rotating copies of x and w,
so the weight comes from HBM; medians): the root (`linear.linear`), the Gluon product computed transposed with rings
of 8 and 4 weight tiles and with x padded to 64 rows (a ring of 6), and cuBLAS (`x @ w.T`). Ratios are time /
cuBLAS's time; the issue's target for these cells is a geomean of 0.95. Writes gluon_linear_<card>.{json,md}. Needs
a Hopper GPU; `--smoke` runs the whole path on a CPU instead (interpreter, tiny shapes, the root standing in for the
Gluon forms and a planted form with other bits), writing gluon_linear_smoke.{json,md}: it checks the script, not a
figure.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import benchmarks.gluon_cells as C  # noqa: E402
import benchmarks.harness as H  # noqa: E402
from benchmarks.bench_speed import HIDDEN, LM_HEAD_M, PROJ, VOCAB  # noqa: E402

#: the most rows a form takes (the others take 16)
MAX_M = {"gluon_noswap": 64}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--smoke", action="store_true", help="the whole path on a CPU, stand-ins for the Gluon forms")
    args = p.parse_args(argv)
    from tik_kernels.ops import linear as root

    if args.smoke:
        device, card = "cpu", "smoke"
        cells = [("tiny", 48, 40, 1), ("tiny", 48, 40, 3)]

        def other(x, w):
            y = root.linear(x, w)
            y.view(torch.int16).view(-1)[0] += 1
            return y

        forms = {"gluon8": root.linear, "gluon4": other, "gluon_noswap": root.linear}
    elif torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:
        from tik_kernels.experimental import gluon_linear_small as g

        device, card = "cuda", H.card_tag("cuda")
        cells = [(n, N, K, M) for n, (N, K) in PROJ.items() for M in (1, 4, 16, 64)]
        cells += [("lm_head", VOCAB, HIDDEN, M) for M in LM_HEAD_M if M <= 16]
        forms = {"gluon8": lambda x, w: g.linear_small(x, w, stages=8),
                 "gluon4": lambda x, w: g.linear_small(x, w, stages=4),
                 "gluon_noswap": lambda x, w: g.linear_small(x, w, swap=False)}
    else:
        print("bench_gluon_linear: needs a Hopper GPU (or --smoke)", file=sys.stderr)
        return 2
    rows = []
    for proj, N, K, M in cells:
        gen = torch.Generator(device).manual_seed(N * 31 + K * 7 + M)
        x = torch.randn(M, K, device=device, dtype=torch.bfloat16, generator=gen)
        w = torch.randn(N, K, device=device, dtype=torch.bfloat16, generator=gen) / math.sqrt(K)
        row = {"cell": f"{proj}[M={M},N={N},K={K}]", "M": M, "bits": True}
        want = root.linear(x, w)
        fit = {name: fn for name, fn in forms.items() if M <= MAX_M.get(name, 16)}
        timed = C.gate(row, fit, (x, w), want, lambda got, want: int((got != want).sum()), "differ")
        contenders = {"root": root.linear, **timed, "cublas": lambda x, w: x @ w.T}
        c = C.time_cell(row, contenders, (x, w), "cublas", args.rounds, nbytes=2 * (M * K + N * K + M * N))
        for n in contenders:
            row[f"{n}_tbps"] = c[n].get("tbps")
        rows.append(row)
        C.show(row)
        del x, w, want
    notes = ["Ratios: time / cuBLAS's time in the same interleaved rounds (lower is faster); bits: the Gluon product "
             "equal to the root's. gluon8 / gluon4: computed transposed, rings of 8 / 4 weight tiles a program; "
             "gluon_noswap: x padded to 64 rows (the root's orientation), a ring of 6."]
    # the figure: over the M <= 16 cells (M = 64, a decode batch, is only the unswapped form's row)
    return C.report(args.out, f"gluon_linear_{card}", device, rows, ("root", *forms), "cublas",
                    [r for r in rows if r["M"] <= 16], "Gluon small-batch linear vs the root's and cuBLAS", notes,
                    "the M <= 16 cells")

if __name__ == "__main__":
    sys.exit(main())
