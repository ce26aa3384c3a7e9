"""The Gluon prefill forward (tik_kernels/ops/attention_gluon.py, the root's forward on Hopper) in its forms, timed
against the root's Triton forward (FWD_GLUON = 0) and SDPA flash at bench_speed's prefill cells, each cell behind a bits
gate (o and lse equal to the Triton forward's).

    PYTHONPATH=. python benchmarks/bench_gluon_fwd.py --out benchmarks/results [--rounds 9]

The Triton forward is timed as `attention._fwd` with FWD_GLUON = 0 (the kernel and its two allocations, without the
autograd wrapper `attention_prefill` adds), the Gluon one as `experimental/gluon_attn_fwd.prefill_forward`; both against
SDPA flash's causal forward in the same interleaved rounds (benchmarks/harness.py: CUDA-graph replay on rotating input
copies, medians). Ratios are time / SDPA flash's time. Writes gluon_fwd_<card>.{json,md}. Needs a Hopper GPU; `--smoke`
runs the whole path on a CPU instead (interpreter, tiny shapes, the root's forward standing in for the Gluon forms and
one planted form with other bits), writing gluon_fwd_smoke.{json,md}: it checks the script, not a figure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import benchmarks.gluon_cells as C  # noqa: E402
import benchmarks.harness as H  # noqa: E402
from benchmarks.bench_speed import HK, HQ, PREFILL_BS, prefill_stock  # noqa: E402
from tik_kernels.e2e.backends import config_overrides  # noqa: E402


def smoke_forms(root) -> dict:
    """--smoke's stand-ins for the Gluon forms: the root's forward under two names, and one with other bits (its o
    one bf16 step up at one element), so the report's green and red paths both run."""

    def same(q, k, v):
        return root._fwd(q, k, v, torch.zeros(1, dtype=torch.int32), q.shape[0], q.shape[2], q.shape[2],
                         root._scale(None, q.shape[-1]), False)

    def other(q, k, v):
        o, lse = same(q, k, v)
        o.view(torch.int16).view(-1)[0] += 1
        return o, lse

    return {"gluon": same, "gluon_own_step": same, "gluon_m128": other}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--smoke", action="store_true", help="the whole path on a CPU, stand-ins for the Gluon forms")
    p.add_argument("--ws", action="store_true",
                   help="also the warp-specialized form (gluon_attn_fwd_ws.py); writes gluon_fwd_ws_<card>.*")
    args = p.parse_args(argv)
    from tik_kernels.ops import attention as root

    if args.smoke:
        device, cells, (hq, hk, d), card = "cpu", ((1, 16), (2, 12)), (4, 2, 16), "smoke"
        forms = smoke_forms(root)
        if args.ws:
            forms["gluon_ws"] = forms["gluon"]
    elif torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:
        from tik_kernels.experimental import gluon_attn_fwd as g

        device, cells, (hq, hk, d), card = "cuda", PREFILL_BS, (HQ, HK, 128), H.card_tag("cuda")
        forms = {"gluon": g.prefill_forward,
                 "gluon_own_step": lambda q, k, v: g.prefill_forward(q, k, v, prefetch=False),
                 "gluon_m128": lambda q, k, v: g.prefill_forward(q, k, v, block_m=128)}
        if args.ws:
            from tik_kernels.experimental import gluon_attn_fwd_ws

            forms["gluon_ws"] = gluon_attn_fwd_ws.prefill_forward
    else:
        print("bench_gluon_fwd: needs a Hopper GPU (or --smoke)", file=sys.stderr)
        return 2
    cu = torch.zeros(1, dtype=torch.int32, device=device)
    scale = root._scale(None, d)
    rows = []
    for B, S in cells:
        gen = torch.Generator(device).manual_seed(B * 7919 + S)
        q, k, v = (torch.randn(B, h, S, d, device=device, dtype=torch.bfloat16, generator=gen) for h in (hq, hk, hk))

        def triton_fwd(q, k, v, B=B, S=S):
            with config_overrides({"attention": {"FWD_GLUON": 0}}):
                return root._fwd(q, k, v, cu, B, S, S, scale, False)

        row = {"cell": f"prefill[B={B},S={S}]", "bits": True}
        want = triton_fwd(q, k, v)
        timed = C.gate(row, forms, (q, k, v), want, lambda got, want: int((got[0] != want[0]).sum()), "o_differ")
        C.time_cell(row, {"triton": triton_fwd, **timed, "sdpa_flash": prefill_stock}, (q, k, v), "sdpa_flash",
                    args.rounds, flops=2 * B * hq * S * S * d)
        rows.append(row)
        C.show(row)
        del q, k, v, want
    stem = "gluon_fwd_ws" if args.ws else "gluon_fwd"
    notes = ["Ratios: time / SDPA flash's time in the same interleaved rounds (lower is faster); bits: the Gluon "
             "forward's o and lse equal to the Triton forward's (FWD_GLUON = 0).", "",
             "gluon (the root's launch): 64 rows a program, the next block's K and V loaded behind this block's "
             "work; gluon_own_step: each step loads its own K and V and waits (the Triton kernel's schedule); "
             "gluon_m128: 128 rows (two warpgroups sharing each K and V block), loads as gluon; gluon_ws (with --ws): "
             "a producer warp and two consumer warpgroups, a ring of two K and two V blocks."]
    return C.report(args.out, f"{stem}_{card}", device, rows, ("triton", *forms), "sdpa_flash",
                    [r for r in rows if r.get("triton_ratio")],
                    "Gluon prefill forward vs the Triton one and SDPA flash",
                    notes, "the timed cells")

if __name__ == "__main__":
    sys.exit(main())
