"""Unified attention on the GPU: bitwise relations at real shapes, then latency against PyTorch SDPA.

    PYTHONPATH=. python benchmarks/bench_attention.py [--out benchmarks/results] [--budget 150]

1. tunables: which CONFIG changes keep the root's bits (prefill and decode) on this GPU;
2. bitwise sweep (Hq=32, Hk=8, D=128, 128-token answer): batch {1, 4, 8, 16} x context {1k, 4k, 8k, 16k}:
   prompt-only prefill == prompt rows of prompt + answer; decode at every answer position (lengths mixed
   within the batch, cache past lens = NaN) == prefill rows; the last sequence alone == its batch rows;
3. decode tunables timed (CUDA graphs), then prefill and forward + backward tunables, each variant's bits
   compared with the default's;
4. timings, medians of interleaved repetitions in one run, CUDA-graph replay (kernel time) and eager (with
   Python launch cost): prefill vs SDPA (flash backend, causal, GQA), forward + backward vs SDPA flash (eager),
   decode (B {1, 8, 32, 128} x L {1k ... 32k}) vs SDPA with a length mask (default backend) and vs SDPA flash on
   an exactly-sized cache.
Writes attention_h200.json and attention_h200.md to --out. No ratio is reported as a result on a red gate.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tik_kernels  # noqa: E402,F401  (sets the runtime up before Triton kernels load)
from benchmarks import harness as H  # noqa: E402
from benchmarks.harness import bits_equal, geomean  # noqa: E402
from tik_kernels.ops import attention as attn  # noqa: E402

HQ, HK, D = 32, 8, 128
ANSWER = 128
T0 = time.time()


def rand(*shape, gen):
    return torch.randn(*shape, device="cuda", generator=gen).to(torch.bfloat16)


def make_cache(k, v, pad):
    B, hk, S, d = k.shape
    kc = torch.full((B, hk, S + pad, d), float("nan"), device="cuda", dtype=k.dtype)
    vc = kc.clone()
    kc[:, :, :S], vc[:, :, :S] = k, v
    return kc, vc


# ----------------------------------------------------------------------------- 1. tunables


def tunables_check() -> list[dict]:
    """Decode at 24 positions and one prefill, under CONFIG variants, against the default's bits."""
    gen = torch.Generator("cuda").manual_seed(1)
    B, S = 2, 1024 + ANSWER
    q, k, v = rand(B, HQ, S, D, gen=gen), rand(B, HK, S, D, gen=gen), rand(B, HK, S, D, gen=gen)
    kc, vc = make_cache(k, v, 64)
    rows = torch.arange(B, device="cuda")
    steps = [torch.tensor([t, t - 62], device="cuda") for t in range(S - 24, S)]
    steps += [torch.tensor([0, 64], device="cuda"), torch.tensor([63, 65], device="cuda")]

    def run():
        full = attn.attention_prefill(q, k, v)
        decs = [attn.attention_decode(q[rows, :, pos][:, :, None], kc, vc, (pos + 1).int()) for pos in steps]
        torch.cuda.synchronize()
        return full, decs

    base_cfg = dict(attn.CONFIG)
    full0, dec0 = run()
    default_ok = all(bits_equal(d[:, :, 0], full0[rows, :, pos]) for d, pos in zip(dec0, steps, strict=True))
    out = [{"variant": "default", "config": base_cfg, "decode_matches_prefill": default_ok}]
    variants = [{"BLOCK_M": 64, "num_warps": 4}, {"BLOCK_M": 64, "num_warps": 8}, {"BLOCK_M": 128, "num_warps": 4},
                {"num_stages": 1}, {"DECODE_BLOCK_M": 64}, {"decode_num_warps": 4},
                {"decode_num_stages": 1}] + [v for v in DECODE_VARIANTS if v]
    for var in variants:
        try:
            full, decs = with_config(var, run)()
            out.append({
                "variant": var,
                "prefill_same_bits_as_default": bits_equal(full, full0),
                "decode_same_bits_as_default": all(bits_equal(a, b) for a, b in zip(decs, dec0, strict=True)),
                "decode_matches_prefill": all(bits_equal(d[:, :, 0], full[rows, :, p])
                                              for d, p in zip(decs, steps, strict=True)),
            })
        except Exception as e:  # a variant that does not compile is a finding, not a crash
            out.append({"variant": var, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    return out


# ----------------------------------------------------------------------------- 2. bitwise sweep


def sweep(budget_s: float) -> list[dict]:
    out = []
    for ctx in (1024, 4096, 8192, 16384):
        for B in (1, 4, 8, 16):
            if time.time() - T0 > budget_s:
                out.append({"B": B, "context": ctx, "skipped": "time budget"})
                continue
            t = time.time()
            gen = torch.Generator("cuda").manual_seed(ctx + B)
            S = ctx + ANSWER
            q, k, v = rand(B, HQ, S, D, gen=gen), rand(B, HK, S, D, gen=gen), rand(B, HK, S, D, gen=gen)
            full = attn.attention_prefill(q, k, v)
            prompt = attn.attention_prefill(q[:, :, :ctx], k[:, :, :ctx], v[:, :, :ctx])
            prefix_ok = bits_equal(prompt, full[:, :, :ctx])
            del prompt
            single = attn.attention_prefill(q[B - 1:], k[B - 1:], v[B - 1:])
            batch_ok = bits_equal(single, full[B - 1:])
            del single
            kc, vc = make_cache(k, v, 64)
            rows = torch.arange(B, device="cuda")
            bad_steps = 0
            for i in range(ANSWER):
                pos = ctx + (i + 37 * rows) % ANSWER
                dec = attn.attention_decode(q[rows, :, pos][:, :, None], kc, vc, (pos + 1).int())
                bad_steps += not bits_equal(dec[:, :, 0], full[rows, :, pos])
            torch.cuda.synchronize()
            out.append({"B": B, "context": ctx, "prefix_matches_full": prefix_ok, "batch_invariance": batch_ok,
                        "decode_positions": ANSWER * B, "decode_steps_differing": bad_steps,
                        "decode_matches_prefill": bad_steps == 0, "seconds": round(time.time() - t, 2)})
            del q, k, v, full, kc, vc
            torch.cuda.empty_cache()
    return out


# ----------------------------------------------------------------------------- 3. timings


def time_interleaved(fns: dict, args: tuple = (), reps: int = 9, graph: bool = False) -> dict:
    """Median per-call µs of each provider fn(*args): the harness's back-to-back calls on rotating copies of
    args, providers interleaved every round. graph=True replays CUDA graphs (kernel time, no Python launch
    cost, as AReaL-TIK runs); a provider that cannot be captured is timed eagerly and says so (graph False)."""
    t = H.compare(fns, args, rounds=reps, graph=graph)
    out = {}
    for name, c in t["contenders"].items():
        if "error" in c:
            raise RuntimeError(f"{name}: {c['error']}")
        out[name] = {"median_us": c["median_us"], "min_us": c["min_us"], "max_us": max(c["samples_us"]),
                     "graph": c["graph"]}
    return out


def sdpa_flash(q, k, v, **kw):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)


def prefill_cell(hq: int, hk: int, B: int, S: int) -> dict:
    gen = torch.Generator("cuda").manual_seed(S + B)
    q, k, v = rand(B, hq, S, D, gen=gen), rand(B, hk, S, D, gen=gen), rand(B, hk, S, D, gen=gen)
    row = {"hq": hq, "hk": hk, "B": B, "S": S}
    fns = {"tik": attn.attention_prefill, "sdpa_flash": lambda q, k, v: sdpa_flash(q, k, v, is_causal=True)}
    r = time_interleaved(fns, (q, k, v), graph=True)
    flops = 2 * B * hq * S * S * D
    row.update({f"{n}_us": t["median_us"] for n, t in r.items()})
    eager = time_interleaved(fns, (q, k, v), reps=5)
    row.update({f"eager_{n}_us": t["median_us"] for n, t in eager.items()})
    row["eager_ratio_vs_sdpa"] = row["eager_tik_us"] / row["eager_sdpa_flash_us"]
    row["tik_tflops"] = flops / (row["tik_us"] * 1e6)
    row["sdpa_tflops"] = flops / (row["sdpa_flash_us"] * 1e6)
    row["ratio_vs_sdpa"] = row["tik_us"] / row["sdpa_flash_us"]
    diff = attn.attention_prefill(q, k, v).float() - sdpa_flash(q, k, v, is_causal=True).float()
    row["max_abs_vs_sdpa"] = float(diff.abs().max())
    return row


def bench_prefill(budget_s: float) -> list[dict]:
    out = []
    for hq, hk in ((32, 8), (16, 8)):
        for B, S in ((1, 1024), (4, 1024), (16, 1024), (1, 4096), (4, 4096), (1, 16384), (2, 16384)):
            if time.time() - T0 > budget_s:
                out.append({"hq": hq, "hk": hk, "B": B, "S": S, "skipped": "time budget"})
                continue
            try:
                out.append(prefill_cell(hq, hk, B, S))
            except Exception as e:
                out.append({"hq": hq, "hk": hk, "B": B, "S": S, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    return out


def train_cell(hq: int, hk: int, B: int, S: int) -> dict:
    """Forward + backward (eager: autograd does not replay in a graph), against SDPA flash with GQA."""
    gen = torch.Generator("cuda").manual_seed(S + B + 7)
    q, k, v = (rand(B, h, S, D, gen=gen).requires_grad_(True) for h in (hq, hk, hk))
    go = rand(B, hq, S, D, gen=gen)

    def step(f):
        return lambda: torch.autograd.grad(f(q, k, v), (q, k, v), go)

    fns = {"tik": step(attn.attention_prefill), "sdpa_flash": step(lambda a, b, c: sdpa_flash(a, b, c, is_causal=True))}
    r = time_interleaved(fns, reps=7)
    row = {"hq": hq, "hk": hk, "B": B, "S": S, **{f"{n}_us": t["median_us"] for n, t in r.items()}}
    row["ratio_vs_sdpa"] = row["tik_us"] / row["sdpa_flash_us"]
    row["grads_deterministic"] = all(bits_equal(a, b) for a, b in zip(fns["tik"](), fns["tik"](), strict=True))
    return row


def bench_train(budget_s: float) -> list[dict]:
    out = []
    for hq, hk in ((32, 8), (16, 8)):
        for B, S in ((1, 1024), (4, 1024), (1, 4096), (4, 4096), (1, 16384)):
            if time.time() - T0 > budget_s:
                out.append({"hq": hq, "hk": hk, "B": B, "S": S, "skipped": "time budget"})
                continue
            try:
                out.append(train_cell(hq, hk, B, S))
            except Exception as e:
                out.append({"hq": hq, "hk": hk, "B": B, "S": S, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    return out


def decode_cell(hq: int, hk: int, B: int, L: int, tuned: dict | None = None) -> dict:
    gen = torch.Generator("cuda").manual_seed(L + B)
    q = rand(B, hq, 1, D, gen=gen)
    kc, vc = rand(B, hk, L, D, gen=gen), rand(B, hk, L, D, gen=gen)
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    mask = (torch.arange(L, device="cuda")[None, :] < lens[:, None])[:, None, None, :]
    row = {"hq": hq, "hk": hk, "B": B, "L": L}
    fns = {"tik": attn.attention_decode}
    if tuned:
        fns["tik_tuned"] = with_config(tuned, fns["tik"])
    fns |= {"sdpa_mask": lambda q, kc, vc, lens: F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask,
                                                                                enable_gqa=True),
            "sdpa_flash": lambda q, kc, vc, lens: sdpa_flash(q, kc, vc)}
    args = (q, kc, vc, lens)
    try:
        sdpa_flash(q, kc, vc)
    except Exception as e:
        fns.pop("sdpa_flash")
        row["sdpa_flash_error"] = str(e)[:120]
    r = time_interleaved(fns, args, graph=True)
    row.update({f"{n}_us": t["median_us"] for n, t in r.items()})
    row["graph_captured"] = {n: t["graph"] for n, t in r.items()}
    eager = time_interleaved(fns, args, reps=5)
    row.update({f"eager_{n}_us": t["median_us"] for n, t in eager.items()})
    row["eager_ratio_vs_best_sdpa"] = row["eager_tik_us"] / min(row.get("eager_sdpa_mask_us", math.inf),
                                                                row.get("eager_sdpa_flash_us", math.inf))
    best = min(v_ for k_, v_ in row.items() if k_.startswith("sdpa") and k_.endswith("_us"))
    if tuned:
        row["tuned_same_bits"] = bits_equal(fns["tik_tuned"](*args), fns["tik"](*args))
    row["ratio_vs_best_sdpa"] = row["tik_us"] / best
    row["ratio_vs_sdpa_mask"] = row["tik_us"] / row["sdpa_mask_us"]
    if tuned:
        row["tuned_ratio_vs_best_sdpa"] = row["tik_tuned_us"] / best
        row["eager_tuned_ratio_vs_best_sdpa"] = row["eager_tik_tuned_us"] / min(
            row.get("eager_sdpa_mask_us", math.inf), row.get("eager_sdpa_flash_us", math.inf))
    row["tik_tbps"] = 2 * kc.numel() * 2 / (row["tik_us"] * 1e6)
    return row


def bench_decode(budget_s: float, tuned: dict | None = None) -> list[dict]:
    out = []
    shapes = [(32, 8, B, L) for L in (1024, 2048, 4096, 8192, 16384, 32768) for B in (1, 8, 32, 128)]
    shapes += [(16, 8, B, L) for B, L in ((1, 4096), (1, 32768), (32, 16384))]
    for hq, hk, B, L in shapes:
        if time.time() - T0 > budget_s:
            out.append({"hq": hq, "hk": hk, "B": B, "L": L, "skipped": "time budget"})
            continue
        try:
            out.append(decode_cell(hq, hk, B, L, tuned))
        except Exception as e:
            out.append({"hq": hq, "hk": hk, "B": B, "L": L, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    return out


_FOLD = {"DECODE_FOLD_GROUPS": 1}
#: decode CONFIG variants (how the fixed chunks are spread over programs: none changes bits): bits checked against
#: the default by `tunables`, timed by `decode_tuning`
DECODE_VARIANTS = [
    {}, _FOLD, {"DECODE_CHUNKS_PER_PROG": 2}, {"DECODE_CHUNKS_PER_PROG": 4}, {"decode_num_warps": 4},
    {"decode_num_stages": 2}, {"decode_num_stages": 4}, {"decode_num_warps": 4, "decode_num_stages": 4},
    {**_FOLD, "decode_num_warps": 4}, {"COMBINE_BLOCK_D": 16}, {"COMBINE_BLOCK_D": 64}, {"COMBINE_BLOCK_D": 128},
    {"COMBINE_CHUNKS": 4}, {"COMBINE_CHUNKS": 16}, {"combine_num_warps": 2}, {"combine_num_warps": 4},
    {"DECODE_FOLD_GROUPS": 256}, {"DECODE_FOLD_GROUPS": 1 << 30}, {"DECODE_BLOCK_M": 32},
    {"DECODE_FUSED_MAX_CHUNKS": 0}, {"DECODE_FUSED_MAX_CHUNKS": 64},
]
#: a short list: the split choice and the decode kernel's warps
QUICK_VARIANTS = [{}, _FOLD, {"DECODE_CHUNKS_PER_PROG": 2}, {"decode_num_warps": 4}, {"decode_num_stages": 2},
                  {"DECODE_FOLD_GROUPS": 1 << 30}, {"DECODE_FUSED_MAX_CHUNKS": 0}, {"DECODE_FUSED_MAX_CHUNKS": 64}]
DECODE_TUNING_CELLS = ((1, 1024), (1, 8192), (1, 32768), (8, 8192), (32, 16384), (128, 4096))


def with_config(var: dict, fn):
    """fn run with attention's CONFIG updated by var (`harness.with_config`)."""
    return H.with_config(attn, var, fn)


def pick_decode_variant(tuning: list[dict], tunables: list[dict]) -> dict:
    """The decode variant with the lowest geomean time ratio to the default over the tuning cells, among those
    timed on every cell, bit-identical to the default there, and bit-identical in the tunables check."""
    ok_bits = [t["variant"] for t in tunables[1:] if t.get("decode_same_bits_as_default")
               and t.get("decode_matches_prefill")]
    base = {(r["B"], r["L"]): r["us"] for r in tuning if r.get("variant") == {} and "us" in r}
    best, best_ratio = {}, 1.0
    for var in DECODE_VARIANTS[1:]:
        rows = [r for r in tuning if r.get("variant") == var]
        if var not in ok_bits or len(rows) != len(base) or not all("us" in r and r["same_bits"] for r in rows):
            continue
        ratio = geomean([r["us"] / base[(r["B"], r["L"])] for r in rows])
        if ratio is not None and ratio < best_ratio:
            best, best_ratio = var, ratio
    return {"variant": best, "geomean_ratio_vs_default": best_ratio}


def decode_tuning(budget_s: float) -> list[dict]:
    """Graph-timed decode under CONFIG variants (bits checked against the default by `tunables`), variant by
    variant over every cell, so a variant the time budget cuts off is missing whole, never on some cells."""
    out = []
    cells = []
    for B, L in DECODE_TUNING_CELLS:
        gen = torch.Generator("cuda").manual_seed(L + B)
        q = rand(B, HQ, 1, D, gen=gen)
        kc, vc = rand(B, HK, L, D, gen=gen), rand(B, HK, L, D, gen=gen)
        lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
        cells.append((B, L, q, kc, vc, lens, attn.attention_decode(q, kc, vc, lens)))
    for var in DECODE_VARIANTS:
        if time.time() - T0 > budget_s:
            out.append({"variant": var, "skipped": "time budget"})
            continue
        for B, L, q, kc, vc, lens, ref_out in cells:
            call = with_config(var, attn.attention_decode)
            try:
                same = bits_equal(call(q, kc, vc, lens), ref_out)
                r = time_interleaved({"tik": call}, (q, kc, vc, lens), reps=5, graph=True)
                out.append({"B": B, "L": L, "variant": var, "us": r["tik"]["median_us"], "same_bits": same})
            except Exception as e:
                out.append({"B": B, "L": L, "variant": var, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    return out


#: prefill and backward CONFIG variants timed by `fwd_tuning` (none may change the forward's or the gradients' bits)
_MEM = {"FWD_TOTAL_IN_MEMORY": 1}
FWD_VARIANTS = [{}, {"BLOCK_M": 64}, {"BLOCK_M": 64, "num_warps": 4}, {"num_warps": 4}, {"num_stages": 1},
                {"BLOCK_M": 64, "num_stages": 1}, _MEM, {**_MEM, "BLOCK_M": 64},
                {**_MEM, "BLOCK_M": 64, "num_warps": 4}]
BWD_VARIANTS = [{}, {"DQ_BLOCK_M": 64}, {"DKDV_BLOCK_N": 128}, {"DKDV_BLOCK_N": 128, "DQ_BLOCK_M": 64},
                {"bwd_num_warps": 4}, {"bwd_num_stages": 1}, {"bwd_num_stages": 3},
                {"DQ_BLOCK_M": 64, "bwd_num_warps": 4}, {"DKDV_BLOCK_N": 128, "bwd_num_stages": 1}]
FWD_TUNING_CELLS = ((1, 4096), (4, 4096), (1, 16384))


def fwd_tuning_cell(B: int, S: int, budget_s: float) -> list[dict]:
    gen = torch.Generator("cuda").manual_seed(S + B + 11)
    q, k, v = (rand(B, h, S, D, gen=gen).requires_grad_(True) for h in (HQ, HK, HK))
    go = rand(B, HQ, S, D, gen=gen)

    def fwd():
        return attn.attention_prefill(q.detach(), k.detach(), v.detach())

    def fwd_bwd():
        return torch.autograd.grad(attn.attention_prefill(q, k, v), (q, k, v), go)

    o_ref, g_ref = fwd(), fwd_bwd()
    out = []
    for kind, variants in (("prefill", FWD_VARIANTS), ("fwd_bwd", BWD_VARIANTS)):
        for var in variants:
            if time.time() - T0 > budget_s:
                out.append({"B": B, "S": S, "kind": kind, "variant": var, "skipped": "time budget"})
                continue
            try:
                call = with_config(var, fwd if kind == "prefill" else fwd_bwd)
                if kind == "prefill":
                    same = bits_equal(call(), o_ref)
                else:
                    same = all(bits_equal(x, y) for x, y in zip(call(), g_ref, strict=True))
                r = time_interleaved({"tik": call}, reps=5, graph=kind == "prefill")
                out.append({"B": B, "S": S, "kind": kind, "variant": var, "us": r["tik"]["median_us"],
                            "same_bits": same})
            except Exception as e:
                out.append({"B": B, "S": S, "kind": kind, "variant": var,
                            "error": f"{type(e).__name__}: {str(e)[:200]}"})
    return out


def fwd_tuning(budget_s: float) -> list[dict]:
    """Prefill (CUDA graph) and forward + backward (eager) under CONFIG variants at Hq=32, Hk=8, with bits (output,
    gradients) compared against the default's."""
    out = []
    for B, S in FWD_TUNING_CELLS:
        out += fwd_tuning_cell(B, S, budget_s)
        torch.cuda.empty_cache()
    return out


def write(out_dir: Path, res: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    H.write_json(out_dir / "attention_h200.json", res)
    gate = res.get("gate_green")
    lines = [f"# attention on {res['env']['gpu']} (torch {res['env']['torch']}, triton {res['env']['triton']}, "
             f"driver {res['env']['driver']})", "",
             f"Command: `{res['command']}`", "",
             "Correctness gate (bitwise sweep + tunables default): " + ("GREEN" if gate else "RED — ratios below are "
                                                                       "not results"), ""]
    lines += ["## Bitwise sweep (Hq=32, Hk=8, D=128, answer 128)", "",
              "| B | context | prefix==full | batch | decode==prefill (positions) |", "|---|---|---|---|---|"]
    for r in res.get("sweep", []):
        if "skipped" in r:
            lines.append(f"| {r['B']} | {r['context']} | skipped | | |")
        else:
            lines.append(f"| {r['B']} | {r['context']} | {r['prefix_matches_full']} | {r['batch_invariance']} | "
                         f"{r['decode_matches_prefill']} ({r['decode_positions']}) |")
    lines += ["", "## Prefill (causal) vs SDPA flash (CUDA-graph replay; eager ratio beside)", "",
              "| Hq/Hk | B | S | tik µs | SDPA µs | ratio | tik TFLOP/s | eager ratio |",
              "|---|---|---|---|---|---|---|---|"]
    for r in res.get("prefill", []):
        if "tik_us" in r:
            lines.append(f"| {r['hq']}/{r['hk']} | {r['B']} | {r['S']} | {r['tik_us']:.1f} | {r['sdpa_flash_us']:.1f} "
                         f"| {r['ratio_vs_sdpa']:.2f} | {r['tik_tflops']:.0f} | {r['eager_ratio_vs_sdpa']:.2f} |")
    lines += ["", "## Forward + backward vs SDPA flash (eager)", "",
              "| Hq/Hk | B | S | tik µs | SDPA µs | ratio | grads deterministic |", "|---|---|---|---|---|---|---|"]
    for r in res.get("train", []):
        if "tik_us" in r:
            lines.append(f"| {r['hq']}/{r['hk']} | {r['B']} | {r['S']} | {r['tik_us']:.1f} | {r['sdpa_flash_us']:.1f} "
                         f"| {r['ratio_vs_sdpa']:.2f} | {r['grads_deterministic']} |")
    lines += ["", "## Decode vs SDPA (mask, default backend) and SDPA flash (exact-length cache), CUDA graphs", "",
              "| Hq/Hk | B | L | tik µs | SDPA mask µs | SDPA flash µs | ratio vs best | tik TB/s | eager ratio vs best"
              " |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in res.get("decode", []):
        if "tik_us" in r:
            fl = f"{r['sdpa_flash_us']:.1f}" if "sdpa_flash_us" in r else "-"
            lines.append(f"| {r['hq']}/{r['hk']} | {r['B']} | {r['L']} | {r['tik_us']:.1f} | {r['sdpa_mask_us']:.1f} "
                         f"| {fl} | {r['ratio_vs_best_sdpa']:.2f} | {r['tik_tbps']:.2f} "
                         f"| {r['eager_ratio_vs_best_sdpa']:.2f} |")
    pick = res.get("decode_pick") or {}
    if pick.get("variant"):
        lines += ["", f"### Decode with the tuned variant {pick['variant']} (geomean "
                  f"{pick['geomean_ratio_vs_default']:.3f}x the default's time over the tuning cells), "
                  "timed in the same rounds as the table above", "",
                  "| Hq/Hk | B | L | tuned µs | default µs | ratio vs best SDPA | same bits as default | eager ratio |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in res.get("decode", []):
            if "tik_tuned_us" in r:
                lines.append(f"| {r['hq']}/{r['hk']} | {r['B']} | {r['L']} | {r['tik_tuned_us']:.1f} | "
                             f"{r['tik_us']:.1f} | {r['tuned_ratio_vs_best_sdpa']:.2f} | {r['tuned_same_bits']} | "
                             f"{r['eager_tuned_ratio_vs_best_sdpa']:.2f} |")
    lines += ["", "## Prefill (graph) and forward + backward (eager) tunables (µs; bits vs default)", "",
              "| kind | B | S | variant | µs | same bits |", "|---|---|---|---|---|---|"]
    for r in res.get("fwd_tuning", []):
        if "us" in r:
            lines.append(f"| {r['kind']} | {r['B']} | {r['S']} | {r['variant'] or 'default'} | {r['us']:.1f} | "
                         f"{r['same_bits']} |")
        elif "error" in r:
            lines.append(f"| {r['kind']} | {r['B']} | {r['S']} | {r['variant']} | {r['error'][:80]} | |")
    lines += ["", "## Decode tunables (CUDA graph µs; bits vs default)", "", "| B | L | variant | µs | same bits |",
              "|---|---|---|---|---|"]
    for r in res.get("decode_tuning", []):
        if "us" in r:
            lines.append(f"| {r['B']} | {r['L']} | {r['variant'] or 'default'} | {r['us']:.1f} | {r['same_bits']} |")
    s = res.get("summary", {})
    lines += ["", f"Geomean time ratio: prefill vs SDPA flash {s.get('prefill_geomean_ratio')}, forward + backward "
              f"vs SDPA flash {s.get('fwd_bwd_geomean_ratio')}, decode vs best SDPA "
              f"{s.get('decode_geomean_ratio_vs_best')}, decode vs SDPA mask {s.get('decode_geomean_ratio_vs_mask')}, "
              f"tuned decode vs best SDPA {s.get('decode_tuned_geomean_ratio_vs_best')}."]
    (out_dir / "attention_h200.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds; later sections are cut short past it")
    ap.add_argument("--config", type=json.loads, default={},
                    help='JSON CONFIG overrides for the whole run, e.g. \'{"BLOCK_N": 128}\' (a different root: '
                         'every section, the bitwise sweep included, runs under it)')
    ap.add_argument("--variants", choices=("all", "quick"), default="all",
                    help="decode variants to time: all, or the split choice and the decode kernel's warps only")
    a = ap.parse_args()
    attn.CONFIG.update(a.config)
    if a.variants == "quick":
        DECODE_VARIANTS[:] = QUICK_VARIANTS
    H.line_buffered()
    res = {"env": H.environment(), "command": "PYTHONPATH=. python benchmarks/bench_attention.py " + " ".join(
               f"--{k} {shlex.quote(json.dumps(v)) if k == 'config' else v}" for k, v in vars(a).items()),
           "config": dict(attn.CONFIG)}
    out_dir = Path(a.out)
    for name, fn in (("tunables", tunables_check), ("sweep", lambda: sweep(a.budget * 0.35)),
                     ("decode_tuning", lambda: decode_tuning(a.budget * 0.5)),
                     ("decode_pick", lambda: pick_decode_variant(res.get("decode_tuning", []),
                                                                 res.get("tunables", []))),
                     ("fwd_tuning", lambda: fwd_tuning(a.budget * 0.6)),
                     ("prefill", lambda: bench_prefill(a.budget * 0.7)),
                     ("train", lambda: bench_train(a.budget * 0.8)),
                     ("decode", lambda: bench_decode(a.budget, (res.get("decode_pick") or {}).get("variant")))):
        t = time.time()
        try:
            res[name] = fn()
        except Exception as e:
            res[name + "_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(f"{name}: {time.time() - t:.1f}s", flush=True)
        sweep_ok = all(r.get("prefix_matches_full", True) and r.get("batch_invariance", True)
                       and r.get("decode_matches_prefill", True) for r in res.get("sweep", []))
        tun_ok = bool(res.get("tunables")) and res["tunables"][0].get("decode_matches_prefill", False)
        res["gate_green"] = sweep_ok and tun_ok and "sweep" in res
        res["summary"] = {
            "prefill_geomean_ratio": geomean([r.get("ratio_vs_sdpa") for r in res.get("prefill", [])]),
            "fwd_bwd_geomean_ratio": geomean([r.get("ratio_vs_sdpa") for r in res.get("train", [])]),
            "decode_geomean_ratio_vs_best": geomean([r.get("ratio_vs_best_sdpa") for r in res.get("decode", [])]),
            "decode_geomean_ratio_vs_mask": geomean([r.get("ratio_vs_sdpa_mask") for r in res.get("decode", [])]),
            "decode_tuned_geomean_ratio_vs_best": geomean([r.get("tuned_ratio_vs_best_sdpa")
                                                           for r in res.get("decode", [])]),
            "decode_pick": (res.get("decode_pick") or {}).get("variant"),
        }
        write(out_dir, res)
    print(json.dumps({"gate_green": res["gate_green"], **res["summary"]}, default=str))
    print((out_dir / "attention_h200.md").read_text())


if __name__ == "__main__":
    main()
