"""Isolated-layer profiling: one decoder layer's phases — prefill, decode, training forward +
backward — on each kernel backend, timed interleaved (medians) in the same process."""

from __future__ import annotations

import statistics
import time

import torch

from tik_kernels.e2e.model import KVCache, ModelConfig, bf16_weights, forward_decode, forward_packed, init_params


def _median_ms(fns: dict, reps: int, device: str) -> dict:
    """Run each fn `reps` times, round-robin, after one warm-up each; median ms per fn."""
    for f in fns.values():
        f()
    samples = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            f()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            samples[k].append((time.perf_counter() - t) * 1e3)
    return {k: {"median_ms": statistics.median(v), "spread_ms": max(v) - min(v), "samples": len(v)}
            for k, v in samples.items()}


def profile_layer(mc: ModelConfig, backends: dict, *, prefill_seqs=(8, 256), decode=(64, 1024),
                  train_seqs=(8, 512), reps: int = 10, device: str = "cuda", seed: int = 0) -> dict:
    """Phase times of one layer (`mc` with layers=1) per backend; `backends` maps a label to a backend."""
    mc = mc.with_layers(1)
    params = init_params(mc, seed, device)
    W = bf16_weights(params, grad=False)
    g = torch.Generator(device="cpu").manual_seed(seed)
    n, s = prefill_seqs
    ids_p = torch.randint(0, mc.vocab, (n * s,), generator=g).to(device)
    cu_p = torch.arange(0, n * s + 1, s, dtype=torch.int32, device=device)
    B, L = decode
    cache = KVCache(mc, B, L + 1, device)
    cache.k.normal_(0, 1, generator=None)
    cache.v.normal_(0, 1)
    ids_d = torch.randint(0, mc.vocab, (B,), generator=g).to(device)
    pos_d = torch.full((B,), L - 1, device=device)
    nt, st = train_seqs
    ids_t = torch.randint(0, mc.vocab, (nt * st,), generator=g).to(device)
    cu_t = torch.arange(0, nt * st + 1, st, dtype=torch.int32, device=device)

    def phases(be):
        def prefill():
            with torch.no_grad():
                forward_packed(mc, be, W, ids_p, cu_p, lens=[s] * n)

        def dec():
            with torch.no_grad():
                forward_decode(mc, be, W, ids_d, pos_d, cache, kv_len=L)

        def train():
            Wg = bf16_weights(params, grad=True)
            h = forward_packed(mc, be, Wg, ids_t, cu_t, lens=[st] * nt)
            h.float().square().mean().backward()

        return {"prefill": prefill, "decode": dec, "train_fwd_bwd": train}

    fns = {}
    for label, be in backends.items():
        for ph, f in phases(be).items():
            fns[f"{label}/{ph}"] = f
    timed = _median_ms(fns, reps, device)
    out: dict = {"shape": {"hidden": mc.hidden, "heads": mc.heads, "kv_heads": mc.kv_heads, "ffn": mc.ffn},
                 "phases": {"prefill": {"seqs": n, "len": s}, "decode": {"batch": B, "context": L},
                            "train_fwd_bwd": {"seqs": nt, "len": st}},
                 "backends": {}}
    for label in backends:
        per = {ph: timed[f"{label}/{ph}"] for ph in ("prefill", "decode", "train_fwd_bwd")}
        out["backends"][label] = per | {"sum_ms": sum(v["median_ms"] for v in per.values())}
    base = out["backends"].get("stock", {}).get("sum_ms")
    if base:
        for r in out["backends"].values():
            r["sum_over_stock"] = r["sum_ms"] / base
    return out
