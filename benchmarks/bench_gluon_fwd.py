"""The Gluon prefill forward (tik_kernels/experimental/gluon_attn_fwd.py) timed against the attention root's forward
and SDPA flash at bench_speed's prefill cells, each cell behind a bits gate (o and lse equal to the root's).

    PYTHONPATH=. python benchmarks/bench_gluon_fwd.py --out benchmarks/results [--rounds 9]

The root's forward is timed as `attention._fwd` (the kernel and its two allocations, without the autograd wrapper
`attention_prefill` adds), the Gluon one as `gluon_attn_fwd.prefill_forward`; both against SDPA flash's causal
forward in the same interleaved rounds (benchmarks/harness.py: CUDA-graph replay on rotating input copies, medians).
Ratios are time / SDPA flash's time. Writes gluon_fwd_<card>.{json,md}. Needs a Hopper GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import benchmarks.harness as H  # noqa: E402
from benchmarks.bench_speed import HK, HQ, PREFILL_BS, prefill_stock  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args(argv)
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        print("bench_gluon_fwd: needs a Hopper GPU", file=sys.stderr)
        return 2
    from tik_kernels.experimental import gluon_attn_fwd as g
    from tik_kernels.ops import attention as root

    cu = torch.zeros(1, dtype=torch.int32, device="cuda")
    forms = {"gluon": g.prefill_forward,
             "gluon_own_step": lambda q, k, v: g.prefill_forward(q, k, v, prefetch=False),
             "gluon_m128": lambda q, k, v: g.prefill_forward(q, k, v, block_m=128)}
    scale = root._scale(None, 128)
    rows = []
    for B, S in PREFILL_BS:
        gen = torch.Generator("cuda").manual_seed(B * 7919 + S)
        q, k, v = (torch.randn(B, h, S, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for h in (HQ, HK, HK))

        def root_fwd(q, k, v, B=B, S=S):
            return root._fwd(q, k, v, cu, B, S, S, scale, False)

        row = {"cell": f"prefill[B={B},S={S}]", "bits": True}
        o_r, l_r = root_fwd(q, k, v)
        timed = {}
        for name, fn in forms.items():
            try:
                o_g, l_g = fn(q, k, v)
            except Exception as e:  # a form that cannot run here is a finding, not the end of the run
                row["bits"] = False
                row[f"{name}_error"] = H.one_line(e)
                continue
            if not (H.bits_equal(o_g, o_r) and H.bits_equal(l_g, l_r)):
                row["bits"] = False
                row[f"{name}_o_differ"] = int((o_g != o_r).sum())
            timed[name] = fn  # timed even with other bits: how fast the schedule is says whether to fix its bits
        t = H.compare({"root": root_fwd, **timed, "sdpa_flash": prefill_stock}, (q, k, v), rounds=args.rounds,
                      flops=2 * B * HQ * S * S * 128)
        c = t["contenders"]
        base = c["sdpa_flash"].get("median_us")
        for n in ("root", *timed, "sdpa_flash"):
            row[f"{n}_us"] = c[n].get("median_us")
            if c[n].get("error"):
                row[f"{n}_error"] = c[n]["error"]
        if base:
            for n in ("root", *timed):
                row[f"{n}_ratio"] = c[n]["median_us"] / base if c[n].get("median_us") else None
        rows.append(row)
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        del q, k, v
    ok = [r for r in rows if r.get("root_ratio")]
    doc = {"env": H.environment("cuda"), "command": H.command_line(), "rows": rows,
           "root_geomean": H.geomean(r.get("root_ratio") for r in ok),
           "gluon_geomean": H.geomean(r.get("gluon_ratio") for r in ok),
           **{f"{n}_geomean": H.geomean(r.get(f"{n}_ratio") for r in ok) for n in forms if n != "gluon"},
           "bits_all": all(r.get("bits") for r in rows)}
    card = H.card_tag("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    H.write_json(args.out / f"gluon_fwd_{card}.json", doc)
    lines = [f"# Gluon prefill forward vs the root's and SDPA flash ({doc['env'].get('gpu')})", "",
             f"`{doc['command']}`", "",
             "Ratios: time / SDPA flash's time in the same interleaved rounds (lower is faster); bits: the Gluon "
             "forward's o and lse equal to the root's.", "",
             "gluon: 64 rows a program, the next block's K and V loaded behind this block's work; gluon_own_step: "
             "each step loads its own K and V and waits (the root's schedule); gluon_m128: 128 rows (two "
             "warpgroups sharing each K and V block), loads as gluon.", "",
             "Geomean over the timed cells: " + ", ".join(f"{n} {doc[n + '_geomean']}" for n in ("root", *forms))
             + f"; bits everywhere: {doc['bits_all']}", "",
             "| cell | bits | " + " | ".join(f"{n} µs" for n in ("root", *forms, "sdpa_flash")) + " | "
             + " | ".join(f"{n} ratio" for n in ("root", *forms)) + " |",
             "|---|---|" + "---|" * (2 * len(forms) + 3)]

    def f(x):
        return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)

    for r in rows:
        lines.append(f"| {r['cell']} | {r['bits']} | "
                     + " | ".join(f(r.get(f"{n}_us")) for n in ("root", *forms, "sdpa_flash")) + " | "
                     + " | ".join(f(r.get(f"{n}_ratio")) for n in ("root", *forms)) + " |")
    (args.out / f"gluon_fwd_{card}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}/gluon_fwd_{card}.json, .md", flush=True)
    return 0 if doc["bits_all"] else 1


if __name__ == "__main__":
    sys.exit(main())
