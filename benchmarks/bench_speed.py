"""TIK's kernels against the strongest stock kernel, at the shapes an RL step on Qwen3-8B runs (issue 16's targets).

    PYTHONPATH=. python benchmarks/bench_speed.py --out benchmarks/results          # the H200 run (--budget-s 445)
    PYTHONPATH=. python benchmarks/bench_speed.py --only decode --quick              # a few cells
    PYTHONPATH=. python benchmarks/bench_speed.py --impl linear=cand.py --only linear  # another file
    PYTHONPATH=. python benchmarks/bench_speed.py --smoke --out /tmp/s               # CPU: the code path only
    PYTHONPATH=. python benchmarks/bench_speed.py --only prefill --variant m128=attention.BLOCK_M=128  # and a CONFIG

Sections (Qwen3-8B: hidden 4096, 32 query heads, 8 KV heads, head dim 128, ffn 12288, vocab 151936):
- linear: `linear(x, w)` vs cuBLAS `x @ w.T`, projections qkv / o / gate_up / down × M in
  {1, 4, 16, 64, 256, 1024, 4096, 16384} and lm_head × M in {1, 16, 256};
- decode: `attention_decode` vs the fastest SDPA variant that runs: the flash backend with the GQA
  group folded into query rows (q.view(B, Hk, G, D) against the shared KV head, so the cache is read
  once), flash with enable_gqa, and the efficient / cuDNN backends folded; B in {1, 8, 32, 128} ×
  L in {1k, 4k, 8k, 16k, 32k}, every sequence at length L (cells that do not fit in memory are skipped
  and say so);
- prefill: causal `attention_prefill` vs SDPA flash (enable_gqa);
- fwdbwd: prefill forward + backward (torch.autograd.grad) vs SDPA flash's;
- varlen: forward + backward of causal attention over packed sequences as an RL trainer has them (64 or 256
  sequences of 48-288 tokens, as the e2e minibatches; 32 of 512-2048), `attention_varlen` vs the faster of torch's
  flash varlen kernel (`torch.nn.attention.varlen`, where this torch has one) and SDPA over the right-padded batch
  (tik e2e's mode A's `padded_attention`, the scatter and gather inside the call);
- ops: rmsnorm vs F.rms_norm, silu_mul vs F.silu(gate) * up, logprob vs eager log_softmax + gather, and
  logprob's forward + backward (the trainer's lm_head: gradients of hidden and of the weight) vs eager
  log_softmax + gather's (issue 16: every other operator no slower).

Timing is benchmarks/harness.py's: CUDA-graph replay of many calls back to back on rotating copies of
the inputs (working set ≥ 4 × L2, so weights and KV come from HBM), contenders interleaved over rounds,
medians. Before a cell is timed TIK's output is checked for bitwise batch invariance there (linear: rows
of M alone; decode: member 0 alone, and equal to the matching row of prefill; prefill: the last member
alone, the first half of the sequence alone; fwdbwd: gradients twice, the last member alone; varlen: gradients
twice, the last sequence alone). A cell
whose check fails is reported RED with no ratio, and its section's summary figures are withheld.

--variant NAME=OP.KEY=VALUE[,OP.KEY=VALUE...] (repeatable) adds a contender `tik:NAME` to every cell of a section that
runs OP: TIK's entry point with those CONFIG values, timed in the same interleaved rounds. A launch choice must not
move bits: a variant whose output differs from the default's in a cell is reported RED there and not timed. The
summary keys are always the default's.

Writes speed_<card>[_<only>][_quick].{json,md} under --out (card: h200, h100, ... as benchmarks/harness.py's
card_tag names the GPU) and, for a full run of a section on a GPU, that section's keys in the card's summary,
<out>/summary_<card>.json (ratios TIK / stock, lower is better; summary_h200.json holds the issues' figures).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import tik_kernels  # noqa: E402  (before triton: sets the interpreter up on a CPU machine)
from benchmarks import harness as H  # noqa: E402

HQ, HK, D = 32, 8, 128
G = HQ // HK
HIDDEN, FFN, VOCAB = 4096, 12288, 151936
PROJ = {"qkv": ((HQ + 2 * HK) * D, HIDDEN), "o": (HIDDEN, HQ * D), "gate_up": (2 * FFN, HIDDEN), "down": (HIDDEN, FFN)}
LINEAR_M = (1, 4, 16, 64, 256, 1024, 4096, 16384)
LM_HEAD_M = (1, 16, 256)
DECODE_B = (1, 8, 32, 128)
DECODE_L = (1024, 4096, 8192, 16384, 32768)
PREFILL_BS = ((1, 1024), (4, 1024), (16, 1024), (1, 4096), (4, 4096), (1, 16384), (2, 16384))
FWDBWD_BS = ((1, 1024), (8, 1024), (1, 4096), (4, 4096), (1, 8192), (1, 16384))
#: (sequences, shortest, longest): packed batches of lengths drawn uniformly between the two (seeded)
VARLEN = ((64, 48, 288), (256, 48, 288), (32, 512, 2048))
OPS_M = {"rmsnorm": (1, 64, 4096, 16384), "silu_mul": (1, 64, 4096), "logprob": (1, 16, 256, 1024),
         "logprob_bwd": (1024, 4096), "logprob_bwd_h1024": (3680,)}
#: the hidden size of an ops cell whose op names one (logprob_bwd_h1024: qwen3-0.6b's lm_head, a minibatch of the
#: e2e run's 4 updates over ~14.7k answer tokens); the others take HIDDEN
OPS_HIDDEN = {"logprob_bwd_h1024": 1024}

#: the issue's targets, per summary key: (bound, "≤" means the figure must not exceed it)
TARGETS = {"linear_geomean": 1.05, "linear_worst": 1.20, "linear_m_le_16_geomean": 0.95, "decode_geomean": 1.05,
           "decode_worst": 1.25, "prefill_geomean": 0.85, "fwd_bwd_geomean": 1.15, "fwd_bwd_varlen_geomean": 1.15}
SECTIONS = ("linear", "decode", "prefill", "fwdbwd", "varlen", "ops")
#: share of --budget-s each section may use (what one leaves is the next one's), over the sum of the sections run:
#: varlen's share came with 25 s more of default budget, so the others keep the seconds they had at 420
SHARE = {"linear": 0.33, "decode": 0.30, "prefill": 0.10, "fwdbwd": 0.15, "varlen": 0.06, "ops": 0.12}
IMPL_MODULES = {"linear": "tik_kernels.ops.linear", "attention": "tik_kernels.ops.attention",
                "rmsnorm": "tik_kernels.ops.rmsnorm", "silu_mul": "tik_kernels.ops.silu_mul",
                "logprob": "tik_kernels.ops.logprob"}


class Shapes:
    """The cells of a run: the issue's (default), fewer (--quick), or tiny ones for the interpreter (--smoke)."""

    def __init__(self, mode: str):
        self.hq, self.hk, self.d = HQ, HK, D
        self.proj, self.linear_m, self.lm_head, self.lm_head_m = PROJ, LINEAR_M, (VOCAB, HIDDEN), LM_HEAD_M
        self.decode = [(B, L) for L in DECODE_L for B in DECODE_B]
        self.prefill, self.fwdbwd, self.varlen = PREFILL_BS, FWDBWD_BS, VARLEN
        self.hidden, self.ffn, self.vocab, self.ops_m = HIDDEN, FFN, VOCAB, OPS_M
        if mode == "quick":
            self.proj = {k: PROJ[k] for k in ("qkv", "down")}
            self.linear_m, self.lm_head_m = (1, 16, 256, 4096), (16,)
            self.decode = [(1, 1024), (1, 32768), (8, 4096), (128, 8192)]
            self.prefill, self.fwdbwd, self.varlen = ((1, 4096), (4, 1024)), ((1, 4096),), ((64, 48, 288),)
            self.ops_m = {"rmsnorm": (1, 4096), "silu_mul": (64,), "logprob": (256,), "logprob_bwd": (1024,)}
        elif mode == "smoke":
            self.hq, self.hk, self.d = 4, 2, 16
            self.proj, self.linear_m, self.lm_head, self.lm_head_m = {"tiny": (40, 32)}, (1, 3), (72, 32), (2,)
            self.decode = [(1, 24), (2, 16)]
            self.prefill, self.fwdbwd, self.varlen = ((2, 16),), ((1, 16),), ((3, 3, 9),)
            self.hidden, self.ffn, self.vocab = 32, 16, 40
            self.ops_m = {"rmsnorm": (3,), "silu_mul": (2,), "logprob": (2,), "logprob_bwd": (3,)}


# ----------------------------------------------------------------------------- implementations


def load_impls(specs: list[str]) -> dict:
    """op -> module: the library's root files, or FILE for each --impl OP=FILE."""
    mods = {op: importlib.import_module(name) for op, name in IMPL_MODULES.items()}
    for spec in specs:
        op, sep, file = spec.partition("=")
        if not sep or op not in IMPL_MODULES:
            sys.exit(f"bench_speed: --impl takes OP=FILE with OP one of {', '.join(IMPL_MODULES)}, got {spec!r}")
        path = Path(file)
        if not path.is_file():
            sys.exit(f"bench_speed: --impl {op}: no file {file}")
        spec_ = importlib.util.spec_from_file_location(f"tik_bench_impl_{op}", path)
        mod = importlib.util.module_from_spec(spec_)
        spec_.loader.exec_module(mod)
        mods[op] = mod
    return mods


def attention_forward(mod, device: str) -> str:
    """Which kernel the attention implementation's bf16 head-dim-128 dense forward runs on `device` with its CONFIG:
    "gluon" (the root's Hopper forward, `attention._gluon_applies`) or "triton", so a prefill figure says which."""
    applies = getattr(mod, "_gluon_applies", None)
    q = torch.empty(1, 1, 1, 128, dtype=torch.bfloat16, device=device)
    return "gluon" if applies is not None and applies(q, mod.CONFIG) else "triton"


def parse_variant(spec: str) -> tuple[str, dict[str, dict[str, int]]]:
    """NAME=OP.KEY=VALUE[,OP.KEY=VALUE...] -> (NAME, {op: {key: value}}); argparse's type (a bad spec is one line)."""
    return H.parse_config_spec(spec, IMPL_MODULES, "--variant")


# ----------------------------------------------------------------------------- stock contenders


def _sdpa(backend, q, k, v, **kw):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def _folded(backend):
    """Decode with the GQA group as query rows: one pass over each KV head serves its G query heads."""

    def fn(q, k, v, lens):
        B, hq, _, d = q.shape
        hk = k.shape[1]
        return _sdpa(backend, q.view(B, hk, hq // hk, d), k, v).view(B, hq, 1, d)

    return fn


def decode_stock(cuda: bool) -> dict:
    out = {"sdpa_flash_folded": _folded(SDPBackend.FLASH_ATTENTION),
           "sdpa_flash_gqa": lambda q, k, v, lens: _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, enable_gqa=True)}
    if cuda:
        out["sdpa_efficient_folded"] = _folded(SDPBackend.EFFICIENT_ATTENTION)
        out["sdpa_cudnn_folded"] = _folded(SDPBackend.CUDNN_ATTENTION)
    return out


def prefill_stock(q, k, v):
    return _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, is_causal=True, enable_gqa=True)


def fwdbwd(attend):
    def fn(q, k, v, do):
        return torch.autograd.grad(attend(q, k, v), (q, k, v), do)

    return fn


# ----------------------------------------------------------------------------- cells


class Bench:
    def __init__(self, args, mods: dict, shapes: Shapes, device: str):
        self.args, self.mods, self.s, self.device = args, mods, shapes, device
        self.cuda = device == "cuda"
        self.rounds = args.rounds

    def randn(self, *shape, gen, scale: float = 1.0, grad: bool = False) -> torch.Tensor:
        t = (torch.randn(*shape, generator=gen, device=self.device) * scale).to(torch.bfloat16)
        return t.requires_grad_(grad)

    def gen(self, *key: int) -> torch.Generator:
        return torch.Generator(self.device).manual_seed(hash((self.args.seed,) + key) % (2**31))

    def fits(self, nbytes: int) -> bool:
        """Whether a cell needing nbytes (inputs + the checks' extra) fits in free GPU memory, with room to spare."""
        if not self.cuda:
            return True
        free, _ = torch.cuda.mem_get_info()
        return nbytes < 0.8 * free

    def variants(self, op: str, tik: Callable, args: tuple) -> tuple[dict, dict]:
        """(contenders, gates) of the --variant runs that set op's CONFIG: `tik:NAME` where its output has the
        default's bits here, a red gate (and no contender) where it does not."""
        out, gates = {}, {}
        mod = self.mods[op]
        ref = None
        for name, over in self.args.variant:
            if op not in over:
                continue
            unknown = sorted(set(over[op]) - set(mod.CONFIG))
            if unknown:
                gates[name] = f"{op} has no tunable {', '.join(unknown)}"
                continue
            fn = H.with_config(mod, over[op], tik)
            if ref is None:
                ref = tik(*args)
            try:
                same = H.tree_bits_equal(fn(*args), ref)
            except Exception as e:
                gates[name] = H.one_line(e)
                continue
            gates[name] = bool(same)
            if same:
                out[f"tik:{name}"] = fn
        return out, gates

    def timed(self, row: dict, gate: dict, contenders: dict, args: tuple, stock: list[str], op: str | None = None,
              **kw) -> dict:
        """Bits gate first; a red gate gets no timing at all (no ratio can be reported from it). op: the operator
        whose --variant runs join the contenders."""
        row["gate"] = gate
        row["gate_green"] = all(gate.values())
        if not row["gate_green"]:
            return row
        if op is not None and self.args.variant:
            extra, row["variant_gate"] = self.variants(op, contenders["tik"], args)
            contenders = {**contenders, **extra}
        t = H.compare(contenders, args, rounds=self.rounds, graph=not self.args.eager, **kw)
        row["timing"] = t
        tik = t["contenders"].get("tik", {})
        if tik.get("graph"):  # an eager stock time carries launch cost a graph-replayed TIK does not
            stock = [n for n in stock if t["contenders"].get(n, {}).get("graph")] or stock
        name, stock_us = H.best_of(t, stock)
        row["stock"] = name
        if "median_us" in tik and stock_us:
            row["tik_us"], row["stock_us"] = tik["median_us"], stock_us
            row["ratio"] = tik["median_us"] / stock_us
            row["variant_ratio"] = {n.partition(":")[2]: c["median_us"] / stock_us
                                    for n, c in t["contenders"].items() if n.startswith("tik:") and "median_us" in c}
            row["graph"] = bool(tik.get("graph") and t["contenders"][name].get("graph"))
        else:
            row["error"] = tik.get("error") or "no stock contender ran"
        return row

    # -- linear

    def linear_cells(self) -> list:
        cells = [(p, n, k, m) for p, (n, k) in self.s.proj.items() for m in self.s.linear_m]
        return cells + [("lm_head", *self.s.lm_head, m) for m in self.s.lm_head_m]

    def linear(self, proj: str, N: int, K: int, M: int) -> dict:
        lin = self.mods["linear"].linear
        row = {"cell": f"{proj}[M={M},N={N},K={K}]", "proj": proj, "M": M, "N": N, "K": K}
        if not self.fits(2 * (M * K + N * K + 2 * M * N) * 2):
            return {**row, "skipped": "does not fit in GPU memory"}
        g = self.gen(N, K, M)
        x, w = self.randn(M, K, gen=g), self.randn(N, K, gen=g, scale=1 / math.sqrt(K))
        with torch.no_grad():
            y = lin(x, w)
            gate = {"row0_alone": H.bits_equal(lin(x[:1], w), y[:1]),
                    "last_row_alone": H.bits_equal(lin(x[-1:], w), y[-1:])}
        del y
        return self.timed(row, gate, {"tik": lambda x, w: lin(x, w), "cublas": lambda x, w: x @ w.T}, (x, w),
                          ["cublas"], op="linear", nbytes=2 * (M * K + N * K + M * N), flops=2 * M * N * K)

    # -- attention

    def decode(self, B: int, L: int) -> dict:
        at = self.mods["attention"]
        hq, hk, d = self.s.hq, self.s.hk, self.s.d
        row = {"cell": f"decode[B={B},L={L}]", "B": B, "L": L}
        kv = 2 * B * hk * L * d * 2
        if not self.fits(kv + 2 * hq * L * d * 2 * 2):
            return {**row, "skipped": "does not fit in GPU memory"}
        g = self.gen(B, L)
        q = self.randn(B, hq, 1, d, gen=g)
        k, v = self.randn(B, hk, L, d, gen=g), self.randn(B, hk, L, d, gen=g)
        lens = torch.full((B,), L, dtype=torch.int32, device=self.device)
        with torch.no_grad():
            out = at.attention_decode(q, k, v, lens)
            gate = {"member0_alone": H.bits_equal(at.attention_decode(q[:1], k[:1], v[:1], lens[:1]), out[:1])}
            # member 0's query as the last row of a prefill over its keys: decode must give that row's bits
            qf = self.randn(1, hq, L, d, gen=g)
            qf[:, :, -1] = q[0, :, 0]
            gate["equals_prefill_row"] = H.bits_equal(at.attention_prefill(qf, k[:1], v[:1])[:, :, -1:], out[:1])
            del qf, out
        contenders = {"tik": lambda q, k, v, lens: at.attention_decode(q, k, v, lens), **decode_stock(self.cuda)}
        stock = [n for n in contenders if n != "tik"]
        return self.timed(row, gate, contenders, (q, k, v, lens), stock, op="attention", nbytes=kv + 2 * q.numel() * 2)

    def qkv(self, B: int, S: int, g, grad: bool = False) -> tuple:
        hq, hk, d = self.s.hq, self.s.hk, self.s.d
        return (self.randn(B, hq, S, d, gen=g, grad=grad), self.randn(B, hk, S, d, gen=g, grad=grad),
                self.randn(B, hk, S, d, gen=g, grad=grad))

    def attn_flops(self, B: int, S: int) -> float:
        return 2 * B * self.s.hq * S * S * self.s.d  # causal: half of 4·B·H·S²·D

    def prefill(self, B: int, S: int) -> dict:
        pre = self.mods["attention"].attention_prefill
        row = {"cell": f"prefill[B={B},S={S}]", "B": B, "S": S}
        if not self.fits(6 * B * self.s.hq * S * self.s.d * 2):
            return {**row, "skipped": "does not fit in GPU memory"}
        q, k, v = self.qkv(B, S, self.gen(B, S, 1))
        with torch.no_grad():
            o = pre(q, k, v)
            h = S // 2
            gate = {"last_member_alone": H.bits_equal(pre(q[-1:], k[-1:], v[-1:]), o[-1:]),
                    "first_half_alone": H.bits_equal(pre(q[:, :, :h], k[:, :, :h], v[:, :, :h]), o[:, :, :h])}
            del o
        return self.timed(row, gate, {"tik": lambda q, k, v: pre(q, k, v), "sdpa_flash": prefill_stock}, (q, k, v),
                          ["sdpa_flash"], op="attention", flops=self.attn_flops(B, S))

    def fwdbwd(self, B: int, S: int) -> dict:
        pre = self.mods["attention"].attention_prefill
        row = {"cell": f"fwdbwd[B={B},S={S}]", "B": B, "S": S}
        if not self.fits(16 * B * self.s.hq * S * self.s.d * 2):
            return {**row, "skipped": "does not fit in GPU memory"}
        g = self.gen(B, S, 2)
        q, k, v = self.qkv(B, S, g, grad=True)
        do = self.randn(B, self.s.hq, S, self.s.d, gen=g)
        tik = fwdbwd(pre)
        a = tik(q, k, v, do)
        last = [t[-1:].detach().clone().requires_grad_() for t in (q, k, v)]
        gate = {"deterministic": H.tree_bits_equal(a, tik(q, k, v, do)),
                "last_member_alone": H.tree_bits_equal(tik(*last, do[-1:]), [t[-1:] for t in a])}
        del a, last
        return self.timed(row, gate, {"tik": tik, "sdpa_flash": fwdbwd(prefill_stock)}, (q, k, v, do),
                          ["sdpa_flash"], op="attention", flops=3.5 * self.attn_flops(B, S))  # backward ≈ 2.5 forwards

    def varlen(self, n: int, lo: int, hi: int) -> dict:
        """Forward + backward over n packed sequences of lo..hi tokens (an RL trainer's minibatch)."""
        from tik_kernels.e2e.backends import padded_attention, padded_rows, varlen_flash

        att = self.mods["attention"].attention_varlen
        rng = torch.Generator().manual_seed(hash((self.args.seed, n, lo, hi)) % (2**31))
        lens = torch.randint(lo, hi + 1, (n,), generator=rng).tolist()
        T, S, hq, hk, d = sum(lens), max(lens), self.s.hq, self.s.hk, self.s.d
        row = {"cell": f"varlen[n={n},L={lo}-{hi}]", "n": n, "tokens": T}
        if not self.fits(12 * T * hq * d * 2 + 4 * n * S * hq * d * 2):
            return {**row, "skipped": "does not fit in GPU memory"}
        g = self.gen(n, lo, hi)
        q, k, v = (self.randn(T, h, d, gen=g, grad=True) for h in (hq, hk, hk))
        do = self.randn(T, hq, d, gen=g)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=self.device, dtype=torch.int32)
        tik = fwdbwd(lambda q, k, v: att(q, k, v, cu, max_seqlen=S))
        rows = torch.tensor(padded_rows(lens), device=self.device)  # built once, outside the timed call
        fns = {"tik": tik, "sdpa_padded": fwdbwd(lambda q, k, v: padded_attention(q, k, v, rows, n, S))}
        flash = varlen_flash() if self.cuda else None
        if flash is not None:
            fns["varlen_flash"] = fwdbwd(lambda q, k, v: flash(q, k, v, cu, S))
        a = tik(q, k, v, do)
        a0 = cu[-2].item()  # the last sequence alone: its rows of the packed call's output
        gate = {"deterministic": H.tree_bits_equal(a, tik(q, k, v, do))}
        with torch.no_grad():
            last = att(q[a0:], k[a0:], v[a0:], cu[-2:] - a0, max_seqlen=lens[-1])
            gate["last_sequence_alone"] = H.bits_equal(last, att(q, k, v, cu, max_seqlen=S)[a0:])
        del a
        flops = 3.5 * sum(2 * hq * L * L * d for L in lens)  # causal forward, the backward ≈ 2.5 forwards
        return self.timed(row, gate, fns, (q, k, v, do), [k_ for k_ in fns if k_ != "tik"], op="attention",
                          flops=flops)

    # -- other operators

    def logprob_bwd(self, M: int, name: str = "logprob_bwd") -> dict:
        """logprob forward + backward over M answer tokens (the trainer's lm_head), against eager log_softmax +
        gather's; gated on deterministic gradients and on row 0's gradient of hidden alone. The hidden size is
        OPS_HIDDEN's for `name` where it names one."""
        mod, s = self.mods["logprob"], self.s
        hidden = OPS_HIDDEN.get(name, s.hidden)
        g = self.gen(M, 13)
        row = {"cell": f"{name}[M={M}]", "op": name, "M": M}
        if not self.fits(6 * M * s.vocab * 4):  # the stock path's logits, their log_softmax and its gradient
            return {**row, "skipped": "does not fit in GPU memory"}
        h = self.randn(M, hidden, gen=g, grad=True)
        w = self.randn(s.vocab, hidden, gen=g, scale=hidden ** -0.5, grad=True)
        t = torch.randint(0, s.vocab, (M,), generator=g, device=self.device)
        dy = torch.randn(M, generator=g, device=self.device)

        def tik(h, w, t, dy):
            return torch.autograd.grad(mod.logprob(h, w, t), (h, w), dy)

        def stock(h, w, t, dy):
            lp = torch.log_softmax((h @ w.T).float(), -1).gather(-1, t[:, None])[:, 0]
            return torch.autograd.grad(lp, (h, w), dy)

        a = tik(h, w, t, dy)
        h0 = h[:1].detach().clone().requires_grad_()
        gate = {"deterministic": H.tree_bits_equal(a, tik(h, w, t, dy)),
                "row0_alone_grad_hidden": H.bits_equal(tik(h0, w, t[:1], dy[:1])[0], a[0][:1])}
        del a
        return self.timed(row, gate, {"tik": tik, "stock": stock}, (h, w, t, dy), ["stock"], op="logprob",
                          flops=6 * M * s.vocab * hidden)

    def op(self, name: str, M: int) -> dict:
        if name.startswith("logprob_bwd"):
            return self.logprob_bwd(M, name)
        mod, s = self.mods[name], self.s
        g = self.gen(M, len(name))
        row = {"cell": f"{name}[M={M}]", "op": name, "M": M}
        if name == "rmsnorm":
            x, w = self.randn(M, s.hidden, gen=g), self.randn(s.hidden, gen=g)
            args, nbytes = (x, w), 2 * x.numel() * 2 + w.numel() * 2
            alone = (x[:1], w)
            fns = {"tik": lambda x, w: mod.rmsnorm(x, w, 1e-6),
                   "stock": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6)}
        elif name == "silu_mul":
            x = self.randn(M, 2 * s.ffn, gen=g)
            args, nbytes, alone = (x,), 3 * M * s.ffn * 2, (x[:1],)

            def stock(x):
                gate, up = x.chunk(2, dim=-1)
                return F.silu(gate) * up

            fns = {"tik": lambda x: mod.silu_mul(x), "stock": stock}
        else:
            h, w = self.randn(M, s.hidden, gen=g), self.randn(s.vocab, s.hidden, gen=g, scale=s.hidden ** -0.5)
            t = torch.randint(0, s.vocab, (M,), generator=g, device=self.device)
            args, nbytes, alone = (h, w, t), (h.numel() + w.numel()) * 2 + M * 12, (h[:1], w, t[:1])
            fns = {"tik": lambda h, w, t: mod.logprob(h, w, t),
                   "stock": lambda h, w, t: torch.log_softmax((h @ w.T).float(), -1).gather(-1, t[:, None])[:, 0]}
        with torch.no_grad():
            gate = {"row0_alone": H.bits_equal(fns["tik"](*alone), fns["tik"](*args)[:1])}
        return self.timed(row, gate, fns, args, ["stock"], op=name, nbytes=nbytes)


# ----------------------------------------------------------------------------- summary and report


def section_summary(section: str, rows: list[dict]) -> dict:
    """The summary keys a section owns; None where a red gate, a cell that failed to run, or no timed cell
    withholds the figure (a geomean or worst case over the cells that happened to run would claim too much).
    Cells skipped because they do not fit in memory are left out, and say so in the table."""
    timed = [r for r in rows if "ratio" in r]
    red = [r["cell"] for r in rows if r.get("gate_green") is False or "error" in r]

    def gm(rs):
        return None if red or not rs else H.geomean(r["ratio"] for r in rs)

    def worst(rs):
        return None if red or not rs else max(r["ratio"] for r in rs)

    if section == "linear":
        return {"linear_geomean": gm(timed), "linear_worst": worst(timed),
                "linear_m_le_16_geomean": gm([r for r in timed if r["M"] <= 16])}
    if section == "decode":
        return {"decode_geomean": gm(timed), "decode_worst": worst(timed)}
    if section == "prefill":
        return {"prefill_geomean": gm(timed)}
    if section == "fwdbwd":
        return {"fwd_bwd_geomean": gm(timed)}
    if section == "varlen":
        return {"fwd_bwd_varlen_geomean": gm(timed)}
    return {f"{op}_geomean": gm([r for r in timed if r["op"] == op]) for op in sorted({r["op"] for r in rows})}


def run_section(bench: Bench, section: str, deadline: float) -> list[dict]:
    s = bench.s
    jobs = {"linear": [(bench.linear, c) for c in bench.linear_cells()],
            "decode": [(bench.decode, c) for c in s.decode],
            "prefill": [(bench.prefill, c) for c in s.prefill],
            "fwdbwd": [(bench.fwdbwd, c) for c in s.fwdbwd],
            "varlen": [(bench.varlen, c) for c in s.varlen],
            "ops": [(bench.op, (op, m)) for op, ms in s.ops_m.items() for m in ms]}[section]
    rows = []
    for fn, cell in jobs:
        if time.time() > deadline:
            rows.append({"cell": f"{section}{list(cell)}", "skipped": "time budget (--budget-s)"})
            print(f"  {rows[-1]['cell']:40s} skipped: time budget", flush=True)
            continue
        t0 = time.time()
        try:
            row = fn(*cell)
        except Exception as e:  # one broken cell must not lose the rest of the run
            row = {"cell": f"{section}{list(cell)}", "error": H.one_line(e)}
        row["seconds"] = round(time.time() - t0, 2)
        rows.append(row)
        print("  " + progress_line(row), flush=True)
        if bench.cuda:
            torch.cuda.empty_cache()
    return rows


def progress_line(r: dict) -> str:
    head = f"{r['cell']:40s}"
    if "skipped" in r:
        return f"{head} skipped: {r['skipped']}"
    if r.get("gate_green") is False:
        return f"{head} RED bits gate {r['gate']}: no ratio"
    if "ratio" not in r:
        return f"{head} error: {r.get('error')}"
    eager = "" if r.get("graph") else "  (eager: not graph-captured)"
    return (f"{head} tik {r['tik_us']:10.2f} us  {r['stock']} {r['stock_us']:10.2f} us  ratio {r['ratio']:.3f}"
            f"{''.join('  ' + v for v in variant_parts(r))}  [{r['seconds']:.1f}s]{eager}")


def variant_parts(r: dict) -> list[str]:
    """'NAME ratio' for each of a row's --variant contenders, 'NAME RED (other bits)' where one moved bits."""
    gates, ratios = r.get("variant_gate", {}), r.get("variant_ratio", {})
    return [f"{n} {ratios[n]:.3f}" if n in ratios else
            f"{n} {'no time' if g is True else 'RED (other bits)' if g is False else 'error: ' + str(g)}"
            for n, g in gates.items()]


def rate_text(c: dict) -> str:
    parts = []
    if "tbps" in c:
        parts.append(f"{c['tbps']:.2f} TB/s ({c['copy_fraction']:.2f} of {H.COPY_TBPS})")
    if "tflops" in c:
        parts.append(f"{c['tflops']:.0f} TFLOP/s ({c['bf16_fraction']:.2f} of {H.BF16_TFLOPS:.0f})")
    return ", ".join(parts)


def variants_cell(r: dict) -> str:
    parts = variant_parts(r)
    return f" ({'; '.join(parts)})" if parts else ""


def variants_note(variants: dict | None) -> str:
    if not variants:
        return ""
    runs = "; ".join(f"{n}: {o}" for n, o in variants.items())
    return f" Ratios in brackets: the --variant runs ({runs}), in the same rounds against the same stock time."


def markdown(doc: dict) -> str:
    e = doc["env"]
    lines = [f"# TIK vs stock kernels on {e['gpu']}", "",
             f"`{doc['command']}`  ", f"torch {e['torch']}, triton {e['triton']}, driver {e['driver']}, "
             f"commit {e['git_commit']}, {e['date']}; the attention forward's kernel: "
             f"{doc.get('attention_forward', 'triton')}", "",
             "Ratio = TIK time / stock time (medians over interleaved rounds, same run): **lower is better**, "
             "< 1 is faster than stock. Timer: " + doc["timer"] + ". A RED bits gate withholds the cell's ratio "
             "and its section's summary figures." + variants_note(doc.get("variants")), "", "## Summary", "",
             "| key | value | target | met |", "|---|---|---|---|"]
    for k, v in doc["summary"].items():
        tgt = TARGETS.get(k)
        val = "withheld (a red gate, a failed cell or no cell)" if v is None else f"{v:.3f}"
        met = "" if tgt is None or v is None else ("yes" if v <= tgt else "no")
        lines.append(f"| {k} | {val} | {'≤ ' + str(tgt) if tgt else 'no slower than before'} | {met} |")
    for section, rows in doc["sections"].items():
        lines += ["", f"## {section}", "",
                  "| cell | bits gate | TIK µs (p10–p90) | stock µs | stock | ratio | TIK rate | graph |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "skipped" in r:
                lines.append(f"| {r['cell']} | skipped: {r['skipped']} | | | | | | |")
            elif "ratio" not in r:
                gate = "RED " + str(r.get("gate")) if r.get("gate_green") is False else "green"
                lines.append(f"| {r['cell']} | {gate} | | | | {r.get('error', 'no ratio')} | | |")
            else:
                tik = r["timing"]["contenders"]["tik"]
                lines.append(f"| {r['cell']} | green | {r['tik_us']:.2f} ({tik['p10_us']:.2f}–{tik['p90_us']:.2f}) | "
                             f"{r['stock_us']:.2f} | {r['stock']} | "
                             f"{r['ratio']:.3f}{variants_cell(r)} | {rate_text(tik)} | "
                             f"{'yes' if r['graph'] else 'no (eager)'} |")
    return "\n".join(lines) + "\n"


def out_name(args, card: str = "h200") -> str:
    """speed_<card>[_<only>...][_quick][_impl]: the card's own file (harness.card_tag), never another card's."""
    if args.smoke:
        return "speed_smoke"
    name = f"speed_{card}"
    if args.only:
        name += "_" + "_".join(args.only)
    if args.quick:
        name += "_quick"
    if args.impl:
        name += "_impl"
    if getattr(args, "variant", None):
        name += "_variants"
    return name


def main(argv: list[str] | None = None) -> int:
    H.line_buffered()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--only", action="append", choices=SECTIONS, help="run only this section (repeatable)")
    ap.add_argument("--quick", action="store_true", help="a few cells per section, fewer rounds (a GPU smoke run)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, one round: the code path on a CPU")
    ap.add_argument("--impl", action="append", default=[], metavar="OP=FILE",
                    help=f"time FILE instead of the library's root for OP ({', '.join(IMPL_MODULES)})")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds per cell (default 15; quick 7)")
    ap.add_argument("--budget-s", type=float, default=445.0, help="later cells are skipped past this (seconds)")
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs: time eager calls with events")
    ap.add_argument("--summary", type=Path, default=None,
                    help="summary file to update (default: the card's, <out>/summary_<card>.json, after a full run "
                         "on a GPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variant", action="append", default=[], type=parse_variant, metavar="NAME=OP.KEY=VALUE[,...]",
                    help="also time TIK with these CONFIG values in the same rounds (repeatable; bits must not move)")
    args = ap.parse_args(argv)
    device = tik_kernels.DEVICE
    if device != "cuda" and not args.smoke:
        print("bench_speed: no CUDA GPU; --smoke runs the code path on the CPU", file=sys.stderr)
        return 2
    args.rounds = args.rounds or (1 if args.smoke else 7 if args.quick else 15)
    mods = load_impls(args.impl)
    shapes = Shapes("smoke" if args.smoke else "quick" if args.quick else "full")
    bench = Bench(args, mods, shapes, device)
    sections = [s for s in SECTIONS if not args.only or s in args.only]
    card = H.card_tag(device)
    summary_path = args.summary
    if summary_path is None and not (args.smoke or args.quick or args.impl) and card != "cpu":
        summary_path = H.summary_path(args.out, card)
    held = H.summary_card(summary_path) if summary_path is not None else None
    if held not in (None, card) and not args.smoke:
        print(f"bench_speed: {summary_path} holds {held.upper()} figures and this is an {card}; give another "
              "--summary", file=sys.stderr)
        return 2
    name = out_name(args, card)
    command = H.command_line([__file__] + (sys.argv[1:] if argv is None else list(argv)))
    doc = {"command": command, "env": H.environment(),
           "impl": {op: str(getattr(m, "__file__", m.__name__)) for op, m in mods.items()},
           "timer": "CUDA-graph replay on rotating input copies" if bench.cuda and not args.eager
           else ("CUDA events, eager" if bench.cuda else "CPU wall clock, eager (Triton interpreter): not a speed"),
           "summary": {}, "sections": {}, "variants": dict(args.variant),
           "attention_forward": attention_forward(mods["attention"], "cuda" if bench.cuda else "cpu")}
    print(f"bench_speed: {doc['env']['gpu']}, sections {sections}, rounds {args.rounds} -> {args.out / name}.*")
    args.out.mkdir(parents=True, exist_ok=True)
    start, used = time.time(), 0.0
    for section in sections:
        used += SHARE[section] / sum(SHARE[s] for s in sections)
        t0 = time.time()
        print(f"[{section}]", flush=True)
        rows = run_section(bench, section, start + used * args.budget_s)
        doc["sections"][section] = rows
        figures = section_summary(section, rows)
        doc["summary"].update(figures)
        print(f"[{section}] {time.time() - t0:.1f}s  " + "  ".join(
            f"{k} {'withheld' if v is None else f'{v:.3f}'}" for k, v in figures.items()), flush=True)
        H.write_json(args.out / f"{name}.json", doc)
        (args.out / f"{name}.md").write_text(markdown(doc))
        complete = not any("skipped" in r and "time budget" in r["skipped"] for r in rows)
        if summary_path is not None and complete:
            H.update_summary(summary_path, figures, source=str(args.out / f"{name}.json"), command=doc["command"])
    print(f"wrote {args.out / name}.json, .md" + (f"; updated {summary_path}" if summary_path else ""))
    red = [r["cell"] for rows in doc["sections"].values() for r in rows if r.get("gate_green") is False]
    if red:
        print(f"RED bits gate at {len(red)} cells: {red[:8]}", file=sys.stderr)
    return 1 if red else 0


if __name__ == "__main__":
    sys.exit(main())
