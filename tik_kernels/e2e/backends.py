"""The kernel backends the decoder (`tik_kernels/e2e/model.py`) runs on: `StockBackend` (cuBLAS, SDPA or torch's flash
varlen kernel, F.rms_norm, log_softmax, torch.compile'd compositions: what a trainer and a rollout engine run
today) and `UnifiedBackend` (TIK's operators, from the library or from given implementation files), with the
CONFIG overrides the decode benchmarks launch them under (`config_overrides`) and `make_backend`.

A backend is the set of calls the decoder makes (embedding, rmsnorm, add_rmsnorm, rope / rope_cache, linear,
silu_mul, attention_varlen / attention_decode, logprob, entropy, sample, sample_logprob, ...); the rollout engine
and the trainer take either.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from tik_kernels.e2e.model import to_device


def _stock_rmsnorm(x, w, eps):
    return F.rms_norm(x.float(), (x.shape[-1],), w.float(), eps).to(x.dtype)


def _stock_add_rmsnorm(x, residual, w, eps):
    r = x + residual
    return _stock_rmsnorm(r, w, eps), r


def _stock_silu_mul(x):
    a, b = x.chunk(2, dim=-1)
    return F.silu(a) * b


def _stock_rope(q, k, pos, theta):
    D = q.shape[-1]
    inv = theta ** (-torch.arange(0, D, 2, device=q.device, dtype=torch.float32) / D)
    ang = pos.to(torch.float32)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]

    def rot(x):
        x1, x2 = x.float().chunk(2, -1)
        return (x.float() * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)

    return rot(q), rot(k)


def _rope_then_scatter(rope, q, k, v, pos, theta, k_cache, v_cache, slots):
    """rope(), then token t's rotated k and its v written into `[slots, Hk, len, D]` caches at [slots[t], :, pos[t]]."""
    q, k = rope(q, k, pos, theta)
    k_cache[slots, :, pos] = k
    v_cache[slots, :, pos] = v
    return q, k


def _stock_rope_cache(q, k, v, pos, theta, k_cache, v_cache, slots):
    """The stock rope and the KV-cache fill as one composition (compiled: the rotation and both scatters in place,
    one fused kernel where inductor manages, as an engine's reshape-and-cache kernel writes the cache)."""
    return _rope_then_scatter(_stock_rope, q, k, v, pos, theta, k_cache, v_cache, slots)


def _key_mask(lens, kv_len: int):
    """[B, 1, 1, kv_len] bool: key j is valid for sequence b while j < lens[b]."""
    return (torch.arange(kv_len, device=lens.device)[None, :] < lens[:, None])[:, None, None, :]


def _stock_logprob_rows(logits, targets, temperature):
    return (logits.float() / temperature).log_softmax(-1).gather(-1, targets[:, None].long())[:, 0]


def _stock_entropy_rows(logits, temperature):
    logp = (logits.float() / temperature).log_softmax(-1)
    return -(logp.exp() * logp).sum(-1)


def _stock_race(logits, temperature, noise):
    """The exponential race: argmax of p / noise with noise ~ Exp(1) is a draw from p."""
    return (logits.float() / temperature).softmax(-1).div(noise).argmax(-1)


#: the pointwise and row-wise compositions a stock engine fuses with torch.compile (matmuls and attention stay
#: cuBLAS and SDPA calls, outside the compiled regions)
STOCK_FUSED = {"rmsnorm": _stock_rmsnorm, "add_rmsnorm": _stock_add_rmsnorm, "silu_mul": _stock_silu_mul,
               "rope": _stock_rope, "rope_cache": _stock_rope_cache, "logprob_rows": _stock_logprob_rows,
               "entropy_rows": _stock_entropy_rows,
               "race": _stock_race}


class _Fused:
    """One stock composition through torch.compile (`dynamic` as torch.compile takes it), falling back to the eager
    composition for good, with a line on stderr, the first time compiling or running the compiled code fails
    (`error` says why)."""

    def __init__(self, name: str, fn, backend: str, dynamic: bool | None = None):
        self.name, self.fn, self.error = name, fn, None
        self.compiled = torch.compile(fn, dynamic=dynamic, backend=backend)

    def __call__(self, *args):
        if self.error is None:
            try:
                return self.compiled(*args)
            except Exception as e:  # noqa: BLE001 - any compiler failure: the eager composition computes the same
                self.error = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                print(f"stock backend: {self.name} runs eagerly, torch.compile failed: {self.error}", file=sys.stderr)
        return self.fn(*args)


def padded_rows(lens: list[int]) -> list[int]:
    """Where each row of sequences packed one after another goes in their right-padded [len(lens), max(lens)] batch."""
    S = max(lens)
    return [b * S + s for b, n in enumerate(lens) for s in range(n)]


def padded_attention(q, k, v, rows: torch.Tensor, batch: int, max_len: int):
    """Causal attention over packed sequences (q [T, Hq, D], k / v [T, Hk, D]) through SDPA: scattered into a
    right-padded [batch, H, max_len, D] batch at `rows` (`padded_rows`, on q's device), gathered back."""

    def pad(t):
        out = t.new_zeros(batch * max_len, t.shape[1], t.shape[2])
        out[rows] = t
        return out.view(batch, max_len, t.shape[1], t.shape[2]).transpose(1, 2)

    o = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), is_causal=True, enable_gqa=True)
    return o.transpose(1, 2).reshape(batch * max_len, q.shape[1], q.shape[2])[rows]


def varlen_flash():
    """torch's flash attention over packed sequences (`torch.nn.attention.varlen.varlen_attn`, what RL trainers run
    as flash-attn's varlen kernel) as attend(q[T, Hq, D], k[T, Hk, D], v, cu_seqlens, max_len) -> [T, Hq, D], causal;
    None where this torch has none. Its keywords moved between releases (causal: `is_causal`, then `window_size`
    (-1, 0); GQA: `enable_gqa` from 2.12), so they are read from its signature; without GQA the KV heads are
    repeated for their query heads (a copy, as a user of that release would make)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        causal = {"window_size": (-1, 0)}
    elif "is_causal" in params:
        causal = {"is_causal": True}
    else:
        return None
    gqa = {"enable_gqa": True} if "enable_gqa" in params else {}

    def attend(q, k, v, cu_seqlens, max_len: int):
        if not gqa and k.shape[1] != q.shape[1]:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        cu = cu_seqlens.to(torch.int32)
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, **causal, **gqa)

    return attend


class StockBackend:
    """Stock PyTorch kernels: what rollout engines and trainers run without TIK.

    `compiled`: the norms, rope, SwiGLU product and the log-softmax / sampling rows go through torch.compile
    (`STOCK_FUSED`: each a fused kernel or two instead of an eager chain of small ones), as a tuned stock engine
    runs them; matmuls stay cuBLAS (`F.linear`) and attention SDPA. `compile_backend` is torch.compile's backend
    (inductor; the CPU tests use aot_eager, which traces the same graphs without generating code)."""

    name = "stock"
    #: attention_decode reads only the first kv_len cache entries (so a graph is captured per KV-length bucket)
    decode_reads_kv_len = True

    def __init__(self, compiled: bool = False, compile_backend: str = "inductor", fill_in_compiled: bool = True,
                 fold_gqa: bool = False, compile_dynamic: bool | None = None, fill_rows: bool = False,
                 varlen: bool | None = None):
        """`fill_in_compiled`: the KV-cache fill inside the compiled rope (`STOCK_FUSED["rope_cache"]`) instead of the
        compiled rope then two scatters; `fill_rows`: the two scatters as row copies into the flattened cache
        (`index_copy_` of each token's [Hk, D] rows at indices built once a step) instead of advanced-index
        assignment (`k_cache[slots, :, pos] = k`, a generic indexing kernel: 7.4 us a call at a decode batch of 64 on
        the H100, two a layer, decode_breakdown_h100_qwen3-0.6b_s22_stock_auto.md; it overrides `fill_in_compiled`);
        the same cache either way;
        `fold_gqa`: decode attention with each KV head's query heads folded into
        query rows instead of `enable_gqa`. Each timed alone beside the others (H100, qwen3-0.6b decode step of 64
        with the host ahead, context 128 / 256; e2e_h100_decode_stock_paths_s23.json): the scatters 2.620 / 2.889 ms,
        the fill inside the compiled rope 2.444 / 2.701 (the default since session 23: mode A is the fastest stock
        path measured), row copies 2.656 / 2.909, folded GQA 2.905 / 3.286 (SDPA's enable_gqa stays).

        `compile_dynamic` is torch.compile's `dynamic`. None (torch's automatic dynamic shapes): a composition's first
        shape is compiled as it is and a dimension seen to change is made symbolic at the next compilation, so the
        batch and length dimensions go symbolic after the second shape while the widths (hidden size, vocabulary)
        stay constants inductor plans its reductions for. True: every dimension symbolic from the first call, one
        compilation (the default until session 21; `bench_e2e.py --decode-backends stock-dynamic`). Timed alone on an
        H100, mode A's lm_head at a decode batch of 64 took 365 us with True and 297 us with None
        (lmhead_decode_h100_s21.json); inside the decode step it took 4.9 ms (with True), which neither explains
        (decode_breakdown_h100_qwen3-0.6b_s21_stock_unified.md).

        `varlen`: the packed forward's attention (the trainer's, the prefill's) through torch's flash varlen kernel
        (`varlen_flash`) instead of SDPA over a padded batch. None: on CUDA where this torch has it and a first small
        case agrees with the padded path (`attention_path` says which ran, and why not); False: never; True: always
        (the CPU tests, with a stand-in)."""
        self.compiled = compiled
        self.varlen = varlen
        self._varlen_fn = None  # the varlen attend once chosen; `attention_path` names the path
        self.attention_path: str | None = None
        self.fill_in_compiled, self.fold_gqa = fill_in_compiled, fold_gqa
        self.fill_rows = fill_rows
        self._memos: dict[str, tuple] = {}  # what `_once_a_step` built for the step in progress, by name
        self.fused = {n: (_Fused(n, f, compile_backend, compile_dynamic) if compiled else f)
                      for n, f in STOCK_FUSED.items()}

    def compile_errors(self) -> dict[str, str]:
        """The compositions that fell back to eager, and why."""
        return {n: f.error for n, f in self.fused.items() if getattr(f, "error", None)}

    def embedding(self, ids, table):
        return F.embedding(ids, table)

    def rmsnorm(self, x, w, eps):
        return self.fused["rmsnorm"](x, w, eps)

    def add_rmsnorm(self, x, residual, w, eps):
        return self.fused["add_rmsnorm"](x, residual, w, eps)

    def linear(self, x, w):
        return F.linear(x, w)

    def silu_mul(self, x):
        return self.fused["silu_mul"](x)

    def rope(self, q, k, pos, theta):
        return self.fused["rope"](q, k, pos, theta)

    def rope_cache(self, q, k, v, pos, theta, k_cache, v_cache, slots):
        if self.fill_rows:  # asked for by name: before the default fill inside the compiled rope
            q, k = self.rope(q, k, pos, theta)
            idx = self._cache_rows(slots, pos, k_cache)
            k_cache.view(-1, k_cache.shape[-1]).index_copy_(0, idx, k.reshape(-1, k.shape[-1]))
            v_cache.view(-1, v_cache.shape[-1]).index_copy_(0, idx, v.reshape(-1, v.shape[-1]))
            return q, k
        if self.fill_in_compiled:
            return self.fused["rope_cache"](q, k, v, pos, theta, k_cache, v_cache, slots)
        return _rope_then_scatter(self.rope, q, k, v, pos, theta, k_cache, v_cache, slots)

    def _cache_rows(self, slots, pos, cache):
        """The rows of a [slots, Hk, len, D] cache, flattened to [slots * Hk * len, D], that token t's [Hk, D] k (or v)
        goes to: ((slots[t] * Hk + h) * len + pos[t]) for h = 0 … Hk-1. Built once a step, as `_decode_mask`: every
        layer's call gets the step's one `slots` and `pos` (the cache's shape is the same in every layer)."""
        _, hk, length, _ = cache.shape

        def build():
            heads = torch.arange(hk, device=cache.device)
            return ((slots.long()[:, None] * hk + heads) * length + pos.long()[:, None]).reshape(-1)

        return self._once_a_step("cache_rows", (slots, pos), tuple(cache.shape), build)

    def _once_a_step(self, name: str, tensors: tuple, extra, build):
        """`build()`, or what it returned for the same `tensors` (these very objects) and an equal `extra`: the step's
        tensors are the same objects in every layer's call (`forward_decode`, `forward_packed`), and the memo holds
        them, so a later step's, new tensors, are never taken for them; nothing writes into them during a step."""
        memo = self._memos.get(name)
        if memo is not None and all(a is b for a, b in zip(memo[0], tensors, strict=True)) and memo[1] == extra:
            return memo[2]
        value = build()
        self._memos[name] = (tensors, extra, value)
        return value

    def qk_norm(self, q, wq, k, wk, eps):
        return self.rmsnorm(q, wq, eps), self.rmsnorm(k, wk, eps)

    def attention_varlen(self, q, k, v, cu_seqlens, lens: list[int]):
        """Causal attention over packed sequences: torch's flash varlen kernel where it is chosen (`varlen`), else
        SDPA over a padded batch (`attention_padded`)."""
        if self.attention_path is None:
            self._choose_attention(q, k, v)
        if self._varlen_fn is not None:
            return self._varlen_fn(q, k, v, cu_seqlens, max(lens))
        return self.attention_padded(q, k, v, cu_seqlens, lens)

    def _choose_attention(self, q, k, v) -> None:
        """The packed attention's path, once: varlen where asked (True), or where available on CUDA and a small case
        (two sequences, the model's heads) agrees with the padded path within bf16's rounding (None)."""
        fn = varlen_flash() if self.varlen is not False else None
        if fn is None:
            self.attention_path = "sdpa_padded" + ("" if self.varlen is False else " (this torch has no varlen_attn)")
            return
        if self.varlen is None and not self.varlen_device(q):
            self.attention_path = "sdpa_padded (varlen_attn is CUDA's)"
            return
        if self.varlen is None:
            why = self.varlen_probe(fn, q, k, v)
            if why is not None:
                self.attention_path = f"sdpa_padded (varlen: {why})"
                return
        self._varlen_fn, self.attention_path = fn, "varlen_flash"

    @staticmethod
    def varlen_device(q) -> bool:
        """Whether the varlen kernel may be chosen for q's device without being asked for (torch's is CUDA's)."""
        return q.is_cuda

    def varlen_probe(self, fn, q, k, v) -> str | None:
        """None where `fn` runs a small case with q, k, v's heads and dtype (two sequences, views of one stacked
        projection, as the trainer has them), agrees with the padded path within bf16's rounding and gives a finite
        gradient; else why not (the kernel missing on this device, a signature this torch does not take, ...).
        The first packed call comes from a pass without gradients (the rollout's prefill, under no_grad, before
        any update or recompute), so the case turns gradients on for itself."""
        try:
            with torch.inference_mode(False), torch.enable_grad():
                self._varlen_case(fn, q, k, v)
        except Exception as e:
            return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
        return None

    def _varlen_case(self, fn, q, k, v) -> None:
        """The probe's case: raises where `fn` is wrong or gives no finite gradient."""
        # q, k, v as the trainer has them: views of one stacked projection, with a gradient
        g = torch.Generator(device=q.device).manual_seed(0)
        hq, hk, d = q.shape[1], k.shape[1], q.shape[2]
        qkv = torch.randn(14, hq + 2 * hk, d, generator=g, device=q.device).to(q.dtype).requires_grad_()
        qs, ks, vs = qkv.split([hq, hk, hk], dim=1)
        cu = torch.tensor([0, 5, 14], device=q.device, dtype=torch.int32)
        got = fn(qs, ks, vs, cu, 9)
        with torch.no_grad():
            want = self.attention_padded(qs, ks, vs, cu, [5, 9])
        if not torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2):
            raise RuntimeError(f"differs from the padded path by {(got - want).abs().max().item():.3g}")
        got.float().square().sum().backward()
        if qkv.grad is None or not torch.isfinite(qkv.grad).all():
            raise RuntimeError("no finite gradient")

    def attention_padded(self, q, k, v, cu_seqlens, lens: list[int]):
        """Causal attention over packed sequences the way a trainer runs stock kernels: the sequences padded
        (at the right) into one [B, H, S_max, D] batch for SDPA's flash backend, the valid rows gathered back.
        Right padding keeps every valid query's causal window free of padding, so no mask is needed; the
        scatter/gather indices come from the host-side lengths, so nothing waits on the GPU."""
        return padded_attention(q, k, v, to_device(padded_rows(lens), q.device), len(lens), max(lens))

    def attention_decode(self, q, k_cache, v_cache, lens, kv_len: int):
        """SDPA over the first `kv_len` (the longest active context, known on the host) cache entries, a key
        mask for the shorter ones. With `fold_gqa` the G query heads of a KV head go in as G query rows against that
        head (`q.view(B, Hk, G, D)`), else `enable_gqa`."""
        B, hq, _, d = q.shape
        hk = k_cache.shape[1]
        k_cache, v_cache = k_cache[:, :, :kv_len], v_cache[:, :, :kv_len]
        mask = self._decode_mask(lens, kv_len)
        if not self.fold_gqa:
            return F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, enable_gqa=True)
        o = F.scaled_dot_product_attention(q.reshape(B, hk, hq // hk, d), k_cache, v_cache, attn_mask=mask)
        return o.reshape(B, hq, 1, d)

    def _decode_mask(self, lens, kv_len: int):
        """The key mask of a decode step, built once a step as an engine builds its attention metadata once: every
        layer's call gets the step's one `lens` tensor (`forward_decode`), so the mask of the first layer's call is
        the others' too (it was four small kernels a layer, ~10 us of a qwen3-0.6b layer's 41 on the H100,
        decode_breakdown_h100_qwen3-0.6b_s22_stock_auto.md; `_once_a_step`)."""
        return self._once_a_step("key_mask", (lens,), kv_len, lambda: _key_mask(lens, kv_len))

    def logprob(self, hidden, w, targets, temperature):
        return self.fused["logprob_rows"](F.linear(hidden, w), targets, temperature)

    def entropy(self, hidden, w, temperature):
        return self.fused["entropy_rows"](F.linear(hidden, w), temperature)

    def logprob_entropy(self, hidden, w, targets, temperature):
        """(logprob with its gradient, entropy without one) from one logits matmul, as a trainer that logs the entropy
        would write it."""
        logits = F.linear(hidden, w)
        lp = self.fused["logprob_rows"](logits, targets, temperature)
        with torch.no_grad():
            return lp, self.fused["entropy_rows"](logits, temperature)

    def sample(self, hidden, w, temperature, seeds):
        """The exponential race (argmax of p / Exp(1) noise, a draw from p): what serving engines run, since
        `torch.multinomial` may wait on the GPU and does not belong in a CUDA graph. The noise is drawn eagerly
        from torch's generator (graph-safe), the race itself may be compiled. Ignores `seeds`."""
        return self._race(F.linear(hidden, w), temperature)

    def sample_logprob(self, hidden, w, temperature, seeds):
        """A token and its log-prob from one lm_head matmul, as an engine samples and records log-probs."""
        logits = F.linear(hidden, w)
        tok = self._race(logits, temperature)
        return tok, self.fused["logprob_rows"](logits, tok, temperature)

    def _race(self, logits, temperature):
        noise = torch.empty(logits.shape, dtype=torch.float32, device=logits.device).exponential_()
        return self.fused["race"](logits, temperature, noise)


def _needs_grad(*tensors: torch.Tensor) -> bool:
    """A gradient will flow through a call on these: the rollout's one-launch forms (no backward) are out."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class UnifiedBackend:
    """TIK's operators, from the library (`tik_kernels.ops.*`) or from given implementation files."""

    name = "unified"
    #: attention_decode's launch depends on the cache's capacity only: one graph per batch bucket
    decode_reads_kv_len = False

    def __init__(self, impl_files: dict[str, str | Path] | None = None, fused_launches: bool = True,
                 fused_lmhead: bool = True, fused_qk_rope: bool = True, fused_mlp: bool = False):
        """`fused_launches=False`: the rollout's rope and KV-cache fill, and its q and k norms, as separate calls
        (`rope_cache`, `qk_norm`; the same bits), to time what the fused launches save. `fused_lmhead`: the token
        and its log-prob from the logprob module's one-pass `sample_logprob` instead of `sample` then `logprob`
        (the same bits; on since its combine's chunk loop is pipelined, logprob's MERGE_STAGES: at a decode batch of
        64 over qwen3's lm_head on an H100 the one pass took 256.5 us against 323.5 us for the two calls, and 467.8 us
        with the plain loop, one run, results/lmhead_decode_h100_s25.json; `fused_lmhead=False`: the two calls).
        `fused_qk_rope`: the rollout's q / k norms, rope and KV-cache fill
        in one launch (the rmsnorm module's `rmsnorm_pair_rope_cache`, where the rope module is the library's, whose
        arithmetic it repeats) instead of two (on: the same bits on an H100, tests/e2e/test_rope_cache.py; a
        qwen3-0.6b decode step of 64 at context 128 / 256 replayed in 1.977 / 2.285 ms against 2.018 / 2.316 ms for
        the two launches, results/e2e_h100_decode_qk_rope_s22.json). `fused_qk_rope=False`: the two calls.
        `fused_mlp`: the rollout's gate_up projection and silu_mul in one launch (linear's `linear_silu_mul`, the
        same bits, where linear and silu_mul are the library's and no gradient is needed); off: on an H100 the
        qwen3-0.6b decode step of 64 replayed in 3.43x / 2.85x its floor at context 128 / 256 with session 32's launch
        (the weight's rows in (gate, up) pairs, the pairs split apart in the epilogue) against 3.39x / 2.86x with the
        two calls, bits the same (results/e2e_h100_decode_mlp_fused_s32.json); the launch with two accumulators (no
        reshuffle, the weight as it is) is not yet timed."""
        from tik_kernels.contract import load_module

        self.sources: dict[str, str] = {}
        mods = {}
        for op in ("embedding", "rmsnorm", "add_rmsnorm", "rope", "linear", "silu_mul", "attention", "logprob",
                   "entropy", "sample"):
            if impl_files and op in impl_files:
                mods[op] = load_module(impl_files[op], f"tik_e2e_{op}")
                self.sources[op] = str(impl_files[op])
            else:
                mods[op] = importlib.import_module(f"tik_kernels.ops.{op}")
                self.sources[op] = f"tik_kernels.ops.{op}"
        self.m = mods
        self.fused_launches, self.fused_lmhead, self.fused_qk_rope = fused_launches, fused_lmhead, fused_qk_rope
        #: `gate_up_silu` in one launch (linear's `linear_silu_mul` computes the library's silu_mul formula)
        self.fused_mlp = fused_mlp and all(self.sources[op] == f"tik_kernels.ops.{op}" for op in ("linear", "silu_mul"))

    def embedding(self, ids, table):
        return self.m["embedding"].embedding(ids, table)

    def rmsnorm(self, x, w, eps):
        # a [T, Hh, D] per-head q/k norm goes in as it is: every (token, head) row normalized over D, the q or k
        # heads of the stacked qkv output read in place (the root addresses them with two strides, no copy)
        return self.m["rmsnorm"].rmsnorm(x, w, eps)

    def add_rmsnorm(self, x, residual, w, eps):
        return self.m["add_rmsnorm"].add_rmsnorm(x, residual, w, eps)

    def qk_norm(self, q, wq, k, wk, eps):
        """Qwen3's q and k norms: the rmsnorm module's `rmsnorm_pair` (one launch, the same bits) where it has one
        and no gradient is needed (the rollout), else two rmsnorm() calls (tests/e2e/test_rope_cache.py)."""
        pair = getattr(self.m["rmsnorm"], "rmsnorm_pair", None) if self.fused_launches else None
        if pair is not None and not _needs_grad(q, k, wq, wk):
            return pair(q, wq, k, wk, eps)
        return self.rmsnorm(q, wq, eps), self.rmsnorm(k, wk, eps)

    def linear(self, x, w):
        return self.m["linear"].linear(x, w)

    def silu_mul(self, x):
        return self.m["silu_mul"].silu_mul(x)

    def gate_up_silu(self, x, w):
        """silu_mul(linear(x, w)) for the MLP's gate_up weight in one launch (linear's `linear_silu_mul`), or None
        where a gradient is needed or the launch does not apply: then the model makes the two calls (`model._mlp`,
        which asks only where `fused_mlp`). The same bits either way (tests/kernels/test_linear.py,
        tests/e2e/test_e2e.py)."""
        return None if _needs_grad(x, w) else self.m["linear"].linear_silu_mul(x, w)

    def rope(self, q, k, pos, theta):
        return self.m["rope"].rope(q, k, pos, theta)

    def rope_cache(self, q, k, v, pos, theta, k_cache, v_cache, slots):
        """The rope module's `rope_cache` (the rope and the KV-cache fill in one launch) where it has one, else
        rope() and the two scatters; the same bits either way (tests/e2e/test_rope_cache.py)."""
        fused = getattr(self.m["rope"], "rope_cache", None) if self.fused_launches else None
        if fused is not None:
            return fused(q, k, v, pos, theta, k_cache, v_cache, slots)
        return _rope_then_scatter(self.rope, q, k, v, pos, theta, k_cache, v_cache, slots)

    def qk_norm_rope_cache(self, q, wq, k, wk, eps, v, pos, theta, k_cache, v_cache, slots):
        """qk_norm(), then rope_cache(): in one launch with `fused_qk_rope` where the rmsnorm module has
        `rmsnorm_pair_rope_cache`, the rope module is the library's and no gradient is needed; the same bits either
        way (tests/e2e/test_rope_cache.py)."""
        fused = (getattr(self.m["rmsnorm"], "rmsnorm_pair_rope_cache", None)
                 if self.fused_qk_rope and self.sources["rope"] == "tik_kernels.ops.rope" else None)
        if fused is not None and not _needs_grad(q, k, wq, wk):
            out = fused(q, wq, k, wk, eps, v, pos, theta, k_cache, v_cache, slots)
            if out is not None:
                return out
        q, k = self.qk_norm(q, wq, k, wk, eps)
        return self.rope_cache(q, k, v, pos, theta, k_cache, v_cache, slots)

    def attention_varlen(self, q, k, v, cu_seqlens, lens: list[int]):
        mod = self.m["attention"]
        if hasattr(mod, "attention_varlen"):
            return mod.attention_varlen(q, k, v, cu_seqlens, max_seqlen=max(lens))
        outs, s = [], 0
        for n in lens:
            qs, ks, vs = (t[s : s + n].transpose(0, 1)[None].contiguous() for t in (q, k, v))
            outs.append(mod.attention_prefill(qs, ks, vs)[0].transpose(0, 1))
            s += n
        return torch.cat(outs)

    def attention_decode(self, q, k_cache, v_cache, lens, kv_len: int):
        return self.m["attention"].attention_decode(q, k_cache, v_cache, lens)

    def logprob(self, hidden, w, targets, temperature):
        return self.m["logprob"].logprob(hidden, w, targets, temperature)

    def entropy(self, hidden, w, temperature):
        return self.m["entropy"].entropy(hidden, w, temperature)

    def logprob_entropy(self, hidden, w, targets, temperature):
        """(logprob with its gradient, entropy without one): one lm_head pass where the logprob module has
        `logprob_entropy` and its CONFIG's FWD_ENTROPY is on, else logprob() and entropy() under no_grad."""
        mod = self.m["logprob"]
        fused = getattr(mod, "logprob_entropy", None)
        if fused is not None and getattr(mod, "CONFIG", {}).get("FWD_ENTROPY", 0):
            return fused(hidden, w, targets, temperature)
        lp = self.logprob(hidden, w, targets, temperature)
        with torch.no_grad():
            return lp, self.entropy(hidden, w, temperature)

    def sample(self, hidden, w, temperature, seeds):
        return self.m["sample"].sample(hidden, w, temperature, seeds)

    def sample_logprob(self, hidden, w, temperature, seeds):
        """sample() and logprob() of its token: with `fused_lmhead`, one pass over the lm_head where the logprob module
        has `sample_logprob` and the sampler reads the same logits (the same BLOCK_K: the same K-sequential dot),
        else the two calls. The same bits either way (tests/kernels/test_sample_logprob.py)."""
        fused = getattr(self.m["logprob"], "sample_logprob", None) if self.fused_lmhead else None
        same_logits = (getattr(self.m["sample"], "CONFIG", {}).get("BLOCK_K")
                       == getattr(self.m["logprob"], "CONFIG", {}).get("BLOCK_K"))
        if fused is not None and same_logits and temperature > 0:
            return fused(hidden, w, temperature, seeds)
        tok = self.sample(hidden, w, temperature, seeds)
        return tok, self.logprob(hidden, w, tok, temperature)


#: the CONFIG values that launch a decode step's kernels with programmatic dependent launch (each operator's own PDL
#: tunable, tik_kernels/ops/_common.py; the roots' default): a kernel's launch and start overlap the end of the kernel
#: before it; no bits. NO_PDL_CONFIG: the same kernels launched without it (to time what it saves)
PDL_CONFIG = {"rmsnorm": {"PDL": 1}, "add_rmsnorm": {"PDL": 1}, "rope": {"PDL": 1}, "linear": {"PDL": 1},
              "silu_mul": {"PDL": 1}, "attention": {"DECODE_PDL": 1}, "logprob": {"PDL": 1}}
NO_PDL_CONFIG = {op: dict.fromkeys(kv, 0) for op, kv in PDL_CONFIG.items()}
#: and the linear's weight rows prefetched into L2 before its wait, while the kernel before it runs (linear PREFETCH;
#: off by default: slower on the H100, e2e_h100_decode_s20.json)
PDL_PREFETCH_CONFIG = {**PDL_CONFIG, "linear": {"PDL": 1, "PREFETCH": 1}}


@contextlib.contextmanager
def config_overrides(over: dict[str, dict], backend: UnifiedBackend | None = None):
    """Operators' CONFIG values set for the block, then restored: the backend's modules, else the library's. A CUDA
    graph keeps the launches of its capture, so a graph captured inside the block replays them after it too."""
    saved = []
    try:
        for op, kv in over.items():
            mod = backend.m[op] if backend is not None else importlib.import_module(f"tik_kernels.ops.{op}")
            for k, v in kv.items():
                saved.append((mod.CONFIG, k, mod.CONFIG[k]))
                mod.CONFIG[k] = v
        yield
    finally:
        for cfg, k, v in reversed(saved):
            cfg[k] = v


def make_backend(name: str, impl_files: dict[str, str | Path] | None = None, stock_compiled: bool = False):
    """`stock_compiled`: the stock backend's fused compositions through torch.compile (`StockBackend`)."""
    if name == "stock":
        return StockBackend(compiled=stock_compiled)
    if name == "unified":
        return UnifiedBackend(impl_files)
    raise ValueError(f"unknown backend {name!r} (stock or unified)")


