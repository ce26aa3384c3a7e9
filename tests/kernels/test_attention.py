"""attention_prefill / attention_decode / attention_varlen: the root passes its contract, and planted bugs
(split-KV decode, a KV block that follows the length, an off-by-one causal mask, ...) fail the right checks.

Probes run lazily, so a planted-bug test pays only for the probes its checks read."""

from __future__ import annotations

import itertools
import math
import types
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from tik_kernels._runtime import DEVICE
from tik_kernels.contract import Results, execute_probe, load_module
from tik_kernels.contracts import get_contract
from tik_kernels.reference import attention as ref

CONTRACT = get_contract("attention")
ROOT_PATH = CONTRACT.root_path


class LazyProbes(Mapping):
    """Probe results computed on first access (what `Results` reads)."""

    def __init__(self, module, probes, device):
        self.module, self.probes, self.device, self.done = module, {p.id: p for p in probes}, device, {}

    def __getitem__(self, pid):
        if pid not in self.done:
            self.done[pid] = execute_probe(self.module, self.probes[pid], self.device)
        return self.done[pid]

    def __iter__(self):
        return iter(self.probes)

    def __len__(self):
        return len(self.probes)


def run_checks(plan, module, root, *, select=lambda name: True, device=DEVICE):
    res = Results(LazyProbes(module, plan.probes, device), LazyProbes(root, plan.probes, device))
    return {c.name: c.run(res) for c in plan.checks if select(c.name)}


@pytest.fixture(scope="module")
def plan():
    return CONTRACT.plan("cpu", 0)


@pytest.fixture(scope="module")
def root():
    return load_module(ROOT_PATH, "attention_root")


def patched(tmp_path: Path, name: str, old: str, new: str):
    """The root's source with one planted change (the target must exist, so a refactor cannot hide a test)."""
    src = ROOT_PATH.read_text()
    assert src.count(old) == 1, f"planting {name}: target not found exactly once"
    path = tmp_path / f"attention_{name}.py"
    path.write_text(src.replace(old, new))
    return load_module(path, f"attention_{name}")


def failed(results, requirement):
    return sorted(n for n, r in results.items() if r.requirement == requirement and not r.passed)


# ----------------------------------------------------------------------------- the root


def test_root_passes_cpu_plan(plan, root):
    cand = load_module(ROOT_PATH, "attention_candidate")
    results = run_checks(plan, cand, root)
    bad = {n: r.detail for n, r in results.items() if not r.passed}
    assert not bad, bad
    needed = {r.name for r in CONTRACT.requirements}
    assert needed == {r.requirement for r in results.values()}, "every requirement has a check"


def test_precomputed_decode_weights_pass_the_whole_plan_with_the_roots_bits(plan, root, tmp_path):
    """The tuner may switch DECODE_PRECOMPUTE_P, DECODE_SPLIT_HEADS and DECODE_PREFETCH on: the candidate keeps
    every contract check, root_bits included."""
    cand = patched(tmp_path, "precompute_p",
                   '"DECODE_PRECOMPUTE_P": 0,\n    "DECODE_SPLIT_HEADS": 0,\n    "DECODE_PREFETCH": 1,',
                   '"DECODE_PRECOMPUTE_P": 1,\n    "DECODE_SPLIT_HEADS": 1,\n    "DECODE_PREFETCH": 2,')
    results = run_checks(plan, cand, root)
    bad = {n: r.detail for n, r in results.items() if not r.passed}
    assert not bad, bad
    assert any(r.requirement == "root_bits" for r in results.values())


DECODE_SCHEMES = {"fused": {"DECODE_PREFETCH": 0}, "precompute_p": {"DECODE_PRECOMPUTE_P": 1},
                  "split_heads": {"DECODE_SPLIT_HEADS": 1},
                  "precompute_p+split_heads": {"DECODE_PRECOMPUTE_P": 1, "DECODE_SPLIT_HEADS": 1},
                  "prefetch=1": {"DECODE_PREFETCH": 1}, "prefetch=2": {"DECODE_PREFETCH": 2},
                  "precompute_p+prefetch=2": {"DECODE_PRECOMPUTE_P": 1, "DECODE_PREFETCH": 2}}
LONG_SCHEMES = ("precompute_p+split_heads", "prefetch=2", "precompute_p+prefetch=2")


@pytest.mark.parametrize("scheme", list(DECODE_SCHEMES))
@pytest.mark.parametrize("S", [1, 8, 9, 41], ids=lambda s: f"S={s}")
def test_decode_every_position_equals_prefill(S, scheme, monkeypatch):
    """A direct check outside the plan: odd lengths, MHA and GQA 4:1, a strided (over-allocated) cache; every
    decode scheme (S=41 spans 6 KV blocks: the precomputed running max is taken over several chunks, and a
    prefetch runs past the last block)."""
    from tik_kernels.ops import attention as attn
    from tik_kernels.ops.attention import attention_decode, attention_prefill

    if S == 41 and scheme not in LONG_SCHEMES:
        pytest.skip("the long case is there for the chunked running max")
    for key, value in DECODE_SCHEMES[scheme].items():
        monkeypatch.setitem(attn.CONFIG, key, value)

    for hq, hk in ((2, 2), (4, 1)):
        q, k, v = (torch.randn(2, h, S, 16).bfloat16() for h in (hq, hk, hk))
        full = attention_prefill(q, k, v)
        big = torch.randn(3, hk, S + 9, 16).bfloat16()
        kc, vc = big[:2].clone(), big[1:].clone()
        kc[:, :, :S], vc[:, :, :S] = k, v
        kc, vc = kc[:, :, : S + 4], vc[:, :, : S + 4]  # strided views: capacity S+4 of an S+9 buffer
        for t in range(S):
            lens = torch.tensor([t + 1, S - t], dtype=torch.int32)
            pos = lens.long() - 1
            out = attention_decode(q[torch.arange(2), :, pos][:, :, None], kc, vc, lens)
            for b in range(2):
                assert torch.equal(out[b, :, 0].view(torch.int16), full[b, :, pos[b]].view(torch.int16)), (hq, hk, t)


def test_entry_points_validate_inputs():
    from tik_kernels.ops.attention import attention_decode, attention_prefill

    q = torch.randn(1, 3, 4, 16).bfloat16()
    with pytest.raises(ValueError, match="multiple"):
        attention_prefill(q, torch.randn(1, 2, 4, 16).bfloat16(), torch.randn(1, 2, 4, 16).bfloat16())
    with pytest.raises(TypeError):
        attention_prefill(q.float(), q.float(), q.float())
    with pytest.raises(ValueError, match="one query"):
        attention_decode(q, q, q, torch.ones(1, dtype=torch.int32))


def test_reference_matches_naive_softmax():
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    s = q @ k.transpose(-1, -2) / math.sqrt(8)
    s = s.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(ref.attention_prefill(q, k, v), torch.softmax(s, -1) @ v)


# ----------------------------------------------------------------------------- planted bugs


def split_kv_variant(root):
    """Flash-decoding: each context split into two chunks whose size follows the length, merged by LSE."""

    def attention_decode(q, k_cache, v_cache, lens, scale=None):
        d = q.shape[-1]
        scale = 1.0 / math.sqrt(d) if scale is None else scale
        g = q.shape[1] // k_cache.shape[1]
        out = torch.empty_like(q)
        for b in range(q.shape[0]):
            n = int(lens[b])
            k = k_cache[b, :, :n].float().repeat_interleave(g, 0)
            v = v_cache[b, :, :n].float().repeat_interleave(g, 0)
            s = (q[b].float() @ k.transpose(-1, -2)) * scale  # [Hq, 1, n]
            parts = [(s[..., :c], v[:, :c]) for c in [(n + 1) // 2]] + [(s[..., (n + 1) // 2:], v[:, (n + 1) // 2:])]
            parts = [(sp, vp) for sp, vp in parts if sp.shape[-1]]
            ms = [sp.amax(-1, keepdim=True) for sp, _ in parts]
            m = torch.stack(ms).amax(0)
            num = sum(torch.exp(sp - m) @ vp for sp, vp in parts)
            den = sum(torch.exp(sp - m).sum(-1, keepdim=True) for sp, _ in parts)
            out[b] = (num / den).to(q.dtype)
        return out

    return types.SimpleNamespace(attention_prefill=root.attention_prefill, attention_varlen=root.attention_varlen,
                                 attention_decode=attention_decode)


def test_split_kv_decode_fails_decode_matches_prefill(plan, root):
    results = run_checks(plan, split_kv_variant(root), root,
                         select=lambda n: "decode_matches_prefill" in n or "accuracy[decode]" in n)
    assert failed(results, "decode_matches_prefill"), "split-KV decode must break decode == prefill"
    # it is accurate: only the bitwise relation can catch it
    assert not failed(results, "accuracy")


def test_block_size_following_length_fails_prefix_and_decode(plan, root, tmp_path):
    bad = patched(tmp_path, "block_follows_S",
                  'BLOCK_N=cfg["BLOCK_N"], VARLEN=varlen, UPCAST=INTERPRET,\n        **_launch_opts(cfg["num_warps"]',
                  'BLOCK_N=cfg["BLOCK_N"] * (2 if max_len > 12 else 1), VARLEN=varlen, UPCAST=INTERPRET,\n'
                  '        **_launch_opts(cfg["num_warps"]')
    results = run_checks(plan, bad, root, select=lambda n: n.startswith("gqa") and any(
        k in n for k in ("prefix_matches_full", "decode_matches_prefill", "accuracy[prefill]", "root_bits[prefill")))
    assert failed(results, "prefix_matches_full")
    assert failed(results, "decode_matches_prefill")
    assert failed(results, "root_bits")
    assert not failed(results, "accuracy")


def test_off_by_one_causal_mask_fails(plan, root, tmp_path):
    bad = patched(tmp_path, "causal_off_by_one",
                  "keep = (k_pos[None, :] <= q_pos[:, None]) & m_k[None, :]\n",
                  "keep = (k_pos[None, :] <= q_pos[:, None] + 1) & m_k[None, :]\n")
    results = run_checks(plan, bad, root, select=lambda n: n.startswith("gqa") and any(
        k in n for k in ("prefix_matches_full[S=7]", "decode_matches_prefill", "accuracy[prefill]",
                         "root_bits[prefill")))
    assert failed(results, "accuracy")
    assert failed(results, "prefix_matches_full")
    assert failed(results, "decode_matches_prefill")
    assert failed(results, "root_bits")


def test_batch_dependent_prefill_fails_batch_invariance(plan, root):
    def attention_prefill(q, k, v, scale=None):
        if q.shape[0] > 1:
            return root.attention_prefill(q, k, v, scale)
        g = q.shape[1] // k.shape[1]
        return torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1), is_causal=True,
            scale=scale).to(q.dtype)

    bad = types.SimpleNamespace(attention_prefill=attention_prefill, attention_decode=root.attention_decode,
                                attention_varlen=root.attention_varlen)
    results = run_checks(plan, bad, root, select=lambda n: "batch_invariance[prefill" in n)
    assert failed(results, "batch_invariance")


def test_varlen_through_other_kernel_fails_varlen_matches_dense(plan, root):
    def attention_varlen(q, k, v, cu_seqlens, scale=None):
        return ref.attention_varlen(q, k, v, cu_seqlens, scale).to(q.dtype)

    bad = types.SimpleNamespace(attention_prefill=root.attention_prefill, attention_decode=root.attention_decode,
                                attention_varlen=attention_varlen)
    results = run_checks(plan, bad, root, select=lambda n: n.endswith("varlen_matches_dense"))
    assert failed(results, "varlen_matches_dense")


def test_nondeterminism_and_input_mutation_fail(plan, root):
    calls = itertools.count()

    def attention_prefill(q, k, v, scale=None):
        out = root.attention_prefill(q, k, v, scale)
        if next(calls) % 2:
            out = out.clone()
            out.view(torch.int16).view(-1)[0] ^= 1  # flip one low bit on every other call
        k.mul_(0.5)
        return out

    bad = types.SimpleNamespace(attention_prefill=attention_prefill, attention_decode=root.attention_decode,
                                attention_varlen=root.attention_varlen)
    results = run_checks(plan, bad, root, select=lambda n: n.endswith("/determinism") or "inputs_unchanged[pre" in n)
    assert failed(results, "determinism")
    assert failed(results, "inputs_unchanged")


def test_wrong_gradient_fails(plan, root, tmp_path):
    bad = patched(tmp_path, "dk_unscaled", "    dk = dk * sm_scale\n", "    dk = dk\n")
    results = run_checks(plan, bad, root, select=lambda n: n.endswith("/gradient"))
    assert failed(results, "gradient")


def test_decode_reading_past_lens_fails(plan, root, tmp_path):
    """A decode that trusts the cache beyond lens (stale keys, then NaN) must fail."""
    bad = patched(tmp_path, "decode_reads_all",
                  "L = tl.load(lens_ptr + b).to(tl.int32)\n    P_TY",
                  "L = tl.load(lens_ptr + b).to(tl.int32) + 1\n    P_TY")
    results = run_checks(plan, bad, root, select=lambda n: "decode_matches_prefill" in n)
    assert failed(results, "decode_matches_prefill")


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_root_passes_gpu_plan(root):
    gpu_plan = CONTRACT.plan("gpu", 0)
    cand = load_module(ROOT_PATH, "attention_candidate")
    results = run_checks(gpu_plan, cand, root, device="cuda")
    bad = {n: r.detail for n, r in results.items() if not r.passed}
    for n, r in results.items():
        print(("PASS " if r.passed else "FAIL ") + n + ": " + r.detail)
    assert not bad, bad
