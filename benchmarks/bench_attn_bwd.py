"""Attention forward + backward: the root's CONFIG (the stored-dS backward, BWD_DS_STORE) against its knobs, the
dq kernel's path and its variants (BWD_DS_STORE = 0), BWD_DQ_FUSED = 1, and SDPA flash, with each config's gradient
bits compared with the root's.

    PYTHONPATH=. python benchmarks/bench_attn_bwd.py --out benchmarks/results            # the H200 sweep
    PYTHONPATH=. python benchmarks/bench_attn_bwd.py --quick --out benchmarks/results    # 3 configs, S=16k only
    PYTHONPATH=. python benchmarks/bench_attn_bwd.py --smoke --out /tmp/s                # CPU: the code path only
    PYTHONPATH=. python benchmarks/bench_attn_bwd.py --fused-all --out benchmarks/results  # every FUSED config too
    PYTHONPATH=. python benchmarks/bench_attn_bwd.py --configs '^ds' --shapes '1,4096;1,16384'   # a subset

Each config is its own copy of tik_kernels/ops/attention.py loaded with CONFIG changed (the tuner's moves; an
upper-case module constant such as DS_STORE_MAX_BYTES may be set the same way); timing is benchmarks/harness.py's
(CUDA-graph replay on rotating inputs, interleaved rounds, medians) of torch.autograd.grad through
attention_prefill, as bench_speed.py's fwdbwd section; each row says whether it was graph-replayed (a config
whose call cannot be captured is timed eager, with its launch cost: not comparable). Per config: median ms, ratio
to SDPA flash, and whether dq / dk / dv have the root's bits at that shape ("same_bits": dk and dv must; dq does if
the MMA gives dS @ K the same bits from dS computed transposed). Writes attn_bwd_h200[_quick][_subset].{json,md}.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import tik_kernels  # noqa: E402,F401  (before triton: sets the interpreter up on a CPU machine)
from benchmarks import harness as H  # noqa: E402
from tik_kernels.contract import load_module  # noqa: E402
from tik_tui.cli.common import regex  # noqa: E402

SOURCE = Path(__file__).resolve().parents[1] / "tik_kernels" / "ops" / "attention.py"
HQ, HK, D = 32, 8, 128
SHAPES = ((1, 1024), (1, 4096), (1, 16384))
#: BWD_DQ_FUSED = 1 with these (DKDV_BLOCK_N, bwd_num_warps, bwd_num_stages); the root's CONFIG otherwise
FUSED = tuple((bn, w, s) for bn in (64, 128) for w in (8, 4) for s in (2, 1))
#: the two-kernel backward's dq kernel: steps of 128 keys (two chained 64-key dots), K/V through TMA, its own
#: warps and stages, a 64-row tile, the launch order of row tiles
#: the root stores dS (BWD_DS_STORE = 1); the dq kernel's variants turn that off: steps of 128 keys (two chained
#: 64-key dots), K/V through TMA, its own warps and stages, a 64-row tile, the launch order of row tiles
_DQ = {"BWD_DS_STORE": 0}
DQ = {
    "dq_kernel": _DQ,
    "dq_t128": {**_DQ, "DQ_TILE_N": 128},
    "dq_tma": {**_DQ, "DQ_TMA": 1},
    "dq_t128_tma": {**_DQ, "DQ_TILE_N": 128, "DQ_TMA": 1},
    "dq_t128_tma_w4": {**_DQ, "DQ_TILE_N": 128, "DQ_TMA": 1, "dq_num_warps": 4},
    "dq_t128_tma_s1": {**_DQ, "DQ_TILE_N": 128, "DQ_TMA": 1, "dq_num_stages": 1},
    "dq_t128_tma_s3": {**_DQ, "DQ_TILE_N": 128, "DQ_TMA": 1, "dq_num_stages": 3},
    "dq_tma_s3": {**_DQ, "DQ_TMA": 1, "dq_num_stages": 3},
    "dq_m64_t128_tma_w4": {**_DQ, "DQ_BLOCK_M": 64, "DQ_TILE_N": 128, "DQ_TMA": 1, "dq_num_warps": 4},
    "dq_m64": {**_DQ, "DQ_BLOCK_M": 64},
    "dq_m64_tma": {**_DQ, "DQ_BLOCK_M": 64, "DQ_TMA": 1},
    "dq_longest": {**_DQ, "DQ_LONGEST_FIRST": 1},
    "fwd_dq_longest": {**_DQ, "FWD_LONGEST_FIRST": 1, "DQ_LONGEST_FIRST": 1},
    "dq_tma_s3_longest": {**_DQ, "DQ_TMA": 1, "dq_num_stages": 3, "DQ_LONGEST_FIRST": 1},
    # the stored-dS path's knobs around the root's (128-key dk/dv tiles, 64-row dq tiles of 4 warps and 3 stages,
    # longest first, at least 256 dk/dv programs, an 8 GiB workspace)
    "ds_bn64": {"DS_DKDV_BLOCK_N": 64},
    "ds_m128_w8": {"DS_DQ_BLOCK_M": 128, "ds_dq_num_warps": 8},
    "ds_s2": {"ds_dq_num_stages": 2},
    "ds_in_order": {"DS_LONGEST_FIRST": 0},
    "ds_any_fill": {"DS_MIN_PROGRAMS": 0},
    # the workspace's budget (a module constant, not a CONFIG entry): at S = 16k (32 / 8 heads) one KV head's dS
    # takes 1.07 GB, 2 GiB holds 1 head, 4 GiB 2, 8 GiB 4 and 16 GiB all 8 in one launch
    **{f"ds_{g}g": {"DS_STORE_MAX_BYTES": g << 30} for g in (2, 4, 16)},
}


def configs(quick: bool, fused_all: bool = False) -> dict[str, dict]:
    """The root, the dq-kernel variants and the fused backward (every FUSED config with fused_all, else the best
    one measured: 128-key tiles, 8 warps, 2 stages); quick: the root, one dq variant and the fused one."""
    fused = FUSED if fused_all else FUSED[4:5]
    out = {"root": {}}
    out.update({n: c for n, c in DQ.items() if not quick or n in ("dq_t128_tma", "dq_kernel")})
    for bn, w, s in fused:
        out[f"fused_bn{bn}_w{w}_s{s}"] = {"BWD_DQ_FUSED": 1, "DKDV_BLOCK_N": bn, "bwd_num_warps": w,
                                          "bwd_num_stages": s}
    return out


def module(name: str, changes: dict):
    """attention.py loaded on its own with CONFIG changed (an upper-case key that is a module constant, not a
    CONFIG entry, sets that constant)."""
    mod = load_module(SOURCE, f"attention_bwd_{name}")
    for key, value in changes.items():
        if key in mod.CONFIG or not hasattr(mod, key):
            mod.CONFIG[key] = value
        else:
            setattr(mod, key, value)
    return mod


def fwdbwd(attend):
    def fn(q, k, v, do):
        return torch.autograd.grad(attend(q, k, v), (q, k, v), do)

    return fn


def sdpa_flash(q, k, v):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--rounds", type=int, default=9)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true", help="tiny shapes (the CPU interpreter)")
    ap.add_argument("--fused-all", action="store_true", help="every FUSED config, not only the best one")
    ap.add_argument("--configs", default="", type=regex,
                    help="only the configs whose name matches this regex (and the root)")
    ap.add_argument("--shapes", default="", help="B,S pairs, e.g. 1,4096;1,16384 (default: S = 1k, 4k, 16k)")
    args = ap.parse_args()
    H.line_buffered()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hq, hk, d, shapes = (4, 2, 16, ((1, 19),)) if args.smoke else (HQ, HK, D, SHAPES[-1:] if args.quick else SHAPES)
    if args.shapes:
        shapes = tuple(tuple(int(x) for x in pair.split(",")) for pair in args.shapes.split(";"))
    chosen = {n: c for n, c in configs(args.quick or args.smoke, args.fused_all).items()
              if n == "root" or re.search(args.configs, n)}
    mods = {name: module(name, ch) for name, ch in chosen.items()}
    rows = []
    for B, S in shapes:
        g = torch.Generator(device=device).manual_seed(S)
        q, k, v = (torch.randn(B, h, S, d, generator=g, device=device).to(torch.bfloat16).requires_grad_()
                   for h in (hq, hk, hk))
        do = torch.randn(B, hq, S, d, generator=g, device=device).to(torch.bfloat16)
        ref = fwdbwd(mods["root"].attention_prefill)(q, k, v, do)
        row = {"cell": f"fwdbwd[B={B},S={S}]", "same_bits": {}}
        failed = {}
        for name, mod in mods.items():
            try:
                got = fwdbwd(mod.attention_prefill)(q, k, v, do)
                again = fwdbwd(mod.attention_prefill)(q, k, v, do)
            except Exception as e:  # a config that does not launch here (shared memory): reported, not timed
                failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                row["same_bits"][name] = {"dq": False, "dk": False, "dv": False, "rerun": False}
                continue
            row["same_bits"][name] = {"dq": H.bits_equal(got[0], ref[0]), "dk": H.bits_equal(got[1], ref[1]),
                                      "dv": H.bits_equal(got[2], ref[2]), "rerun": H.tree_bits_equal(got, again)}
        contenders = {name: fwdbwd(mod.attention_prefill) for name, mod in mods.items() if name not in failed}
        contenders["sdpa_flash"] = fwdbwd(sdpa_flash) if device == "cuda" else fwdbwd(
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
        row["timing"] = H.compare(contenders, (q, k, v, do), rounds=args.rounds)
        t = row["timing"]["contenders"]
        t.update({name: {"error": why} for name, why in failed.items()})
        flash = t["sdpa_flash"].get("median_us")
        print(f"[{row['cell']}]  sdpa_flash {flash / 1e3:.2f} ms")
        for name in mods:
            us, bits = t[name].get("median_us"), row["same_bits"][name]
            if us is None:
                print(f"  {name:24s} error: {t[name].get('error')}")
                continue
            print(f"  {name:24s} {us / 1e3:8.2f} ms  {us / flash:5.3f}x flash  "
                  f"bits dq {int(bits['dq'])} dk {int(bits['dk'])} dv {int(bits['dv'])} rerun {int(bits['rerun'])}"
                  f"  {'graph' if t[name].get('graph') else 'EAGER: ' + str(t[name].get('fallback', ''))[:100]}")
        rows.append(row)
        del q, k, v, do, ref
    name = "attn_bwd_" + ("smoke" if args.smoke else "h200") + ("_quick" if args.quick else "") + (
        "_subset" if args.configs or args.shapes else "")
    out = Path(args.out)
    doc = {"command": H.command_line(), "environment": H.environment(device),
           "configs": chosen, "rows": rows}
    H.write_json(out / f"{name}.json", doc)
    lines = [f"# {name}", "", f"`{doc['command']}`", "",
             "| cell | config | ms | × flash | dq dk dv bits = root | rerun | timed |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        t = row["timing"]["contenders"]
        flash = t["sdpa_flash"].get("median_us")
        for cfg, bits in row["same_bits"].items():
            us = t[cfg].get("median_us")
            ms = f"{us / 1e3:.2f}" if us else t[cfg].get("error", "-")
            ratio = f"{us / flash:.3f}" if us and flash else "-"
            timed = "graph replay" if t[cfg].get("graph") else ("eager" if us else "-")
            lines.append(f"| {row['cell']} | {cfg} | {ms} | {ratio} | "
                         f"{int(bits['dq'])} {int(bits['dk'])} {int(bits['dv'])} | {int(bits['rerun'])} | {timed} |")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / name}.json, .md")


if __name__ == "__main__":
    main()
