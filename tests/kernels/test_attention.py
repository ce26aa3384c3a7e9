"""attention_prefill / attention_decode / attention_varlen: the root passes its contract, and planted bugs
(split-KV decode, a KV block or a chunk that follows the length, a merge order that follows the number of
chunks, a pairwise combine, an off-by-one causal mask, ...) fail the right checks.

Probes run lazily, so a planted-bug test pays only for the probes its checks read."""

from __future__ import annotations

import itertools
import math
import types
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from launch_spy import spy_launches

from tik_kernels._runtime import DEVICE
from tik_kernels.contract import Results, execute_probe, load_module, same_bits
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


def patched(tmp_path: Path, name: str, old: str, new: str, *more: tuple[str, str]):
    """The root's source with a planted change, one (old, new) or more (each target must exist exactly once, so a
    refactor cannot hide a test)."""
    src = ROOT_PATH.read_text()
    for a, b in ((old, new), *more):
        assert src.count(a) == 1, f"planting {name}: target not found exactly once"
        src = src.replace(a, b)
    path = tmp_path / f"attention_{name}.py"
    path.write_text(src)
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


def test_split_choices_pass_the_whole_plan_with_the_roots_bits(plan, root, tmp_path):
    """The tuner may move how decode spreads the chunks over programs (chunks per program, combine loads): the
    candidate keeps the decode checks of the five-chunk shape, root_bits included (prefill's kernels are the
    root's; every position under every split choice is the next test's)."""
    cand = patched(tmp_path, "split_choices",
                   '"DECODE_CHUNKS_PER_PROG": 1,\n    "DECODE_FOLD_GROUPS": 1024,\n    "COMBINE_BLOCK_D": 32,\n'
                   '    "COMBINE_CHUNKS": 8,',
                   '"DECODE_CHUNKS_PER_PROG": 3,\n    "DECODE_FOLD_GROUPS": 1024,\n    "COMBINE_BLOCK_D": 16,\n'
                   '    "COMBINE_CHUNKS": 2,')
    results = run_checks(plan, cand, root, select=lambda n: n.startswith("sharp") and "decode" in n)
    bad = {n: r.detail for n, r in results.items() if not r.passed}
    assert not bad, bad
    assert any(r.requirement == "root_bits" for r in results.values())


def test_folded_decode_passes_decode_checks_with_the_roots_bits(plan, root, tmp_path):
    """No split (one program per sequence and KV head merges every chunk itself, as prefill does): same bits."""
    cand = patched(tmp_path, "fold", '"DECODE_FOLD_GROUPS": 1024,', '"DECODE_FOLD_GROUPS": 1,')
    results = run_checks(plan, cand, root, select=lambda n: n.startswith("sharp") and "decode" in n)
    bad = {n: r.detail for n, r in results.items() if not r.passed}
    assert not bad, bad
    assert failed(results, "root_bits") == [] and any(r.requirement == "root_bits" for r in results.values())


#: every way decode may spread the chunks: chunks per program (2 and 3 end a program inside a sequence and
#: leave programs past its end), no split, combine loading 1 or 2 chunk states per step, narrow head-dim slices
#: (the default merges in the pair's last program, DECODE_FUSED_MAX_CHUNKS; 0 takes the combine kernel)
SPLITS = {"per_prog=1": {}, "per_prog=2,combine=1x16": {"DECODE_CHUNKS_PER_PROG": 2, "COMBINE_CHUNKS": 1,
                                                        "COMBINE_BLOCK_D": 16, "DECODE_FUSED_MAX_CHUNKS": 0},
          "per_prog=2,fused": {"DECODE_CHUNKS_PER_PROG": 2, "COMBINE_CHUNKS": 1},
          "per_prog=3": {"DECODE_CHUNKS_PER_PROG": 3}, "combine kernel": {"DECODE_FUSED_MAX_CHUNKS": 0},
          "fold": {"DECODE_FOLD_GROUPS": 1}}


@pytest.mark.parametrize("split", list(SPLITS))
def test_decode_every_position_equals_prefill(split, monkeypatch):
    """A direct check outside the plan: one decode batch holds every position 0 ... S-1 of a sequence (S = 19:
    three chunks, the last partial), GQA 4:1 (and MHA under the default split), a strided (over-allocated,
    batch-broadcast) cache whose entries past each position are NaN."""
    from tik_kernels.ops import attention as attn
    from tik_kernels.ops.attention import attention_decode, attention_prefill

    for key, value in SPLITS[split].items():
        monkeypatch.setitem(attn.CONFIG, key, value)
    S = 19
    for hq, hk in ((4, 1), (2, 2))[: 2 if split == "per_prog=1" else 1]:
        q, k, v = (torch.randn(1, h, S, 16).bfloat16() * 2 for h in (hq, hk, hk))
        full = attention_prefill(q, k, v)
        big = torch.full((1, hk, S + 9, 16), float("nan")).bfloat16()
        kc, vc = big.clone(), big.clone()
        kc[:, :, :S], vc[:, :, :S] = k, v
        # capacity S+4 of an S+9 buffer, the same cache for all S batch rows (batch stride 0)
        kc, vc = (c[:, :, : S + 4].expand(S, -1, -1, -1) for c in (kc, vc))
        lens = torch.arange(1, S + 1, dtype=torch.int32).flip(0)  # positions S-1 ... 0
        out = attention_decode(q[0, :, lens.long() - 1].transpose(0, 1)[:, :, None].contiguous(), kc, vc, lens)
        want = full[0, :, lens.long() - 1].transpose(0, 1)
        assert torch.equal(out[:, :, 0].view(torch.int16), want.view(torch.int16)), (split, hq, hk)
    # the fused merge leaves its arrival counters zero for the next launch
    assert all(not c.any() for c in attn._DECODE_COUNTERS.values())


def test_total_in_memory_keeps_prefill_and_gradient_bits(monkeypatch):
    """FWD_TOTAL_IN_MEMORY moves the running total's acc from registers to a scratch tile: same bits (output,
    and the lse the gradients are computed from), dense and packed."""
    from tik_kernels.ops import attention as attn

    q, k, v = (torch.randn(2, h, 21, 16).bfloat16().mul(3).requires_grad_(True) for h in (4, 2, 2))
    go = torch.randn(2, 4, 21, 16).bfloat16()
    cu = torch.tensor([0, 21, 42], dtype=torch.int32)
    packed = [t.detach().transpose(1, 2).reshape(42, -1, 16) for t in (q, k, v)]
    runs = []
    for flag in (0, 1):
        monkeypatch.setitem(attn.CONFIG, "FWD_TOTAL_IN_MEMORY", flag)
        out = attn.attention_prefill(q, k, v)
        runs.append([out, *torch.autograd.grad(out, (q, k, v), go), attn.attention_varlen(*packed, cu)])
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


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


def _prefill_relations(group: str):
    """The checks a length-dependent prefill breaks, within one probe group: prefix and decode relations, root
    bits, and accuracy (which it must keep)."""
    return lambda n: n.startswith(group) and any(
        k in n for k in ("prefix_matches_full", "decode_matches_prefill", "accuracy[prefill]", "root_bits[prefill"))


def test_block_size_following_length_fails_prefix_and_decode(plan, root, tmp_path):
    bad = patched(tmp_path, "block_follows_S",
                  'block_n = cfg["BLOCK_N"]  # the KV block',
                  'block_n = cfg["BLOCK_N"] * (2 if max_len > 12 else 1)  # the KV block')
    results = run_checks(plan, bad, root, select=_prefill_relations("gqa"))
    assert failed(results, "prefix_matches_full")
    assert failed(results, "decode_matches_prefill")
    assert failed(results, "root_bits")
    assert not failed(results, "accuracy")


def _sharp_decode(name: str) -> bool:
    return name.startswith("sharp") and any(k in name for k in ("decode_matches_prefill", "accuracy[decode]"))


def test_chunk_size_following_length_fails_prefix_and_decode(plan, root, tmp_path):
    """Prefill chunks of 2 blocks up to 20 keys and of 4 beyond: accurate, but a prompt-only prefill and decode
    (which keeps the frozen chunk) no longer match the long sequence's rows."""
    bad = patched(tmp_path, "chunk_follows_S",
                  'CHUNK=cfg["CHUNK_BLOCKS"], VARLEN=varlen,',
                  'CHUNK=cfg["CHUNK_BLOCKS"] * (2 if max_len > 20 else 1), VARLEN=varlen,')
    results = run_checks(plan, bad, root, select=_prefill_relations("sharp"))
    assert failed(results, "prefix_matches_full")
    assert failed(results, "decode_matches_prefill")
    assert failed(results, "root_bits")
    assert not failed(results, "accuracy")


def test_decode_chunk_following_length_fails_decode_matches_prefill(plan, root, tmp_path):
    """Decode chunks that grow with the cache (fewer, longer chunks for long contexts): accurate, wrong bits."""
    bad = patched(tmp_path, "decode_chunk_follows_L",
                  'bn, chunk = cfg["BLOCK_N"], cfg["CHUNK_BLOCKS"]\n',
                  'bn, chunk = cfg["BLOCK_N"], cfg["CHUNK_BLOCKS"] * (2 if cap > 24 else 1)\n')
    results = run_checks(plan, bad, root, select=_sharp_decode)
    assert failed(results, "decode_matches_prefill")


def test_merge_order_following_chunk_count_fails_decode_matches_prefill(plan, root, tmp_path):
    """The combine merges chunks last to first once a sequence has 4 chunks or more (merge order that follows
    the number of chunks)."""
    bad = patched(tmp_path, "merge_reversed",
                  "            c = c0 + i\n            ok = m_row & ((o_g * 0 + c) < n_chunks)\n",
                  "            c = tl.where(n_chunks < 4, c0 + i, n_chunks - 1 - (c0 + i))\n"
                  "            ok = m_row & ((o_g * 0 + c) < n_chunks) & ((o_g * 0 + c) >= 0)\n")
    results = run_checks(plan, bad, root, select=_sharp_decode)
    assert failed(results, "decode_matches_prefill")
    assert not failed(results, "accuracy")


def test_tree_combine_fails_decode_matches_prefill(plan, root, tmp_path):
    """The combine merges chunk states pairwise, ((0 + 1) + (2 + 3)) + 4, instead of in one sequential order."""
    src_loop = "    for c0 in range(0, n_chunks, GROUP):\n"
    tree_loop = ("    for c0 in range(0, n_chunks, GROUP):\n"
                 "        m_p, l_p, acc_p = m_t, l_t, acc_t\n"
                 "        m_t = tl.full([BLOCK_G], float('-inf'), dtype=tl.float32)\n"
                 "        l_t = tl.zeros([BLOCK_G], dtype=tl.float32)\n"
                 "        acc_t = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)\n")
    src_end = "    return acc_t / l_t[:, None]\n"
    tree_end = ("        m_t, a_p, a_t = _merge(m_p, m_t)\n"
                "        l_t = _merge_sum(l_p, a_p, l_t, a_t)\n"
                "        acc_t = _merge_sum(acc_p, a_p[:, None], acc_t, a_t[:, None])\n" + src_end)
    src = ROOT_PATH.read_text().replace('"COMBINE_CHUNKS": 8,', '"COMBINE_CHUNKS": 2,')
    assert src.count(src_loop) == 1 and src.count(src_end) == 1
    path = tmp_path / "attention_tree.py"
    path.write_text(src.replace(src_loop, tree_loop).replace(src_end, tree_end))
    bad = load_module(path, "attention_tree")
    results = run_checks(plan, bad, root, select=_sharp_decode)
    assert failed(results, "decode_matches_prefill")
    assert not failed(results, "accuracy")


def test_off_by_one_causal_mask_fails(plan, root, tmp_path):
    bad = patched(tmp_path, "causal_off_by_one",
                  "keep = (k_pos[None, :] <= q_pos[:, None]) & m_k[None, :]\n        m_i, l_i, acc",
                  "keep = (k_pos[None, :] <= q_pos[:, None] + 1) & m_k[None, :]\n        m_i, l_i, acc",
                  # the diagonal blocks inside the sequence, masked in the first loop (FWD_ONE_LOOP)
                  ('s = tl.where(k_pos[None, :] <= q_pos[:, None], s, float("-inf"))',
                   's = tl.where(k_pos[None, :] <= q_pos[:, None] + 1, s, float("-inf"))'))
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
                  "L = tl.load(lens_ptr + b).to(tl.int32)\n    n_blocks",
                  "L = tl.load(lens_ptr + b).to(tl.int32) + 1\n    n_blocks")
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


@pytest.mark.gpu
@pytest.mark.parametrize("split", [{}, {"DECODE_FOLD_GROUPS": 1}, {"DECODE_FOLD_GROUPS": 1 << 30},
                                   {"DECODE_FOLD_GROUPS": 1 << 30, "DECODE_CHUNKS_PER_PROG": 3},
                                   {"DECODE_FOLD_GROUPS": 1 << 30, "COMBINE_CHUNKS": 2, "COMBINE_BLOCK_D": 128},
                                   {"DECODE_FOLD_GROUPS": 1 << 30, "DECODE_FUSED_MAX_CHUNKS": 0},
                                   {"DECODE_FOLD_GROUPS": 1 << 30, "DECODE_FUSED_MAX_CHUNKS": 0,
                                    "DECODE_CHUNKS_PER_PROG": 2}],
                         ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "default")
def test_gpu_decode_every_position_equals_prefill(split, monkeypatch):
    """Real shapes (Hq=32, Hk=8, D=128, 2100 keys: five 512-key chunks, the last partial): one decode batch holds
    every position of the sequence (a batch of 2100 folds by default; the other choices split it, the pair's last
    program merging or, with DECODE_FUSED_MAX_CHUNKS 0, the combine kernel), each row bitwise equal to the prefill
    row."""
    from tik_kernels.ops import attention as attn

    for key, value in split.items():
        monkeypatch.setitem(attn.CONFIG, key, value)
    S, gen = 2100, torch.Generator("cuda").manual_seed(3)
    q, k, v = (torch.randn(1, h, S, 128, generator=gen, device="cuda").bfloat16() for h in (32, 8, 8))
    full = attn.attention_prefill(q, k, v)
    kc = torch.full((1, 8, S + 100, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    vc = kc.clone()
    kc[:, :, :S], vc[:, :, :S] = k, v
    lens = torch.arange(1, S + 1, dtype=torch.int32, device="cuda")
    out = attn.attention_decode(q[0].transpose(0, 1)[:, :, None].contiguous(), kc.expand(S, -1, -1, -1),
                                vc.expand(S, -1, -1, -1), lens)
    want = full[0].transpose(0, 1)
    bad = (out[:, :, 0].view(torch.int16) != want.view(torch.int16)).any(-1).any(-1).nonzero().flatten()
    assert bad.numel() == 0, f"{bad.numel()} positions differ, first {bad[:8].tolist()}"


def test_the_decode_register_caps_reach_their_launches(monkeypatch):
    """decode_short_maxnreg caps the short-cache decode launch, decode_maxnreg the other (Triton's maxnreg; 0: no
    keyword, the compiler's choice); the interpreter takes them and gives the same bits (on a GPU:
    `test_gpu_short_decode_register_caps_move_no_bits`)."""
    import tik_kernels.ops.attention as A

    seen = spy_launches(monkeypatch, A, "_attn_decode_kernel", lambda args, kwargs: kwargs.get("maxnreg"))
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 1, 16, generator=gen).bfloat16()
    kc, vc = (torch.randn(2, 2, 24, 16, generator=gen).bfloat16() for _ in range(2))
    lens = torch.tensor([5, 24], dtype=torch.int32)
    want = A.attention_decode(q, kc, vc, lens)
    monkeypatch.setitem(A.CONFIG, "decode_short_maxnreg", 128)
    short = A.attention_decode(q, kc, vc, lens)
    monkeypatch.setitem(A.CONFIG, "DECODE_SHORT_KEYS", 0)  # every cache takes the other launch
    monkeypatch.setitem(A.CONFIG, "decode_maxnreg", 96)
    other = A.attention_decode(q, kc, vc, lens)
    assert seen == [None, 128, 96]
    assert same_bits(short, want) and same_bits(other, want)


@pytest.mark.gpu
@pytest.mark.parametrize("caps", [{"decode_short_maxnreg": 128}, {"decode_short_maxnreg": 168},
                                  {"decode_short_num_warps": 8, "decode_short_maxnreg": 64}],
                         ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()))
def test_gpu_short_decode_register_caps_move_no_bits(caps, monkeypatch):
    """A rollout's decode at qwen3-0.6b's heads (Hq=16, Hk=8, D=128) over a 400-key cache (the short launch): one
    batch holds every position of a 300-token sequence, NaN past each; with the register caps each row is the
    default launch's bits and the prefill row's."""
    from tik_kernels.ops import attention as attn

    S, gen = 300, torch.Generator("cuda").manual_seed(5)
    q, k, v = (torch.randn(1, h, S, 128, generator=gen, device="cuda").bfloat16() for h in (16, 8, 8))
    full = attn.attention_prefill(q, k, v)
    kc = torch.full((1, 8, 400, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    vc = kc.clone()
    kc[:, :, :S], vc[:, :, :S] = k, v
    lens = torch.arange(1, S + 1, dtype=torch.int32, device="cuda")
    qd = q[0].transpose(0, 1)[:, :, None].contiguous()

    def decode():
        return attn.attention_decode(qd, kc.expand(S, -1, -1, -1), vc.expand(S, -1, -1, -1), lens)

    want = decode()
    for key, value in caps.items():
        monkeypatch.setitem(attn.CONFIG, key, value)
    got = decode()
    assert same_bits(got, want)
    assert same_bits(got[:, :, 0], full[0].transpose(0, 1))


def _forward_and_grads(fwd, q, k, v) -> tuple:
    """fwd's output and the gradients of sum(o^2) with respect to q, k and v (fresh leaves each call)."""
    qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
    o = fwd(qq, kk, vv)
    o.float().square().sum().backward()
    return o, qq.grad, kk.grad, vv.grad


def _tma_matches_pointers(run, monkeypatch) -> tuple:
    """run() with FWD_TMA off, then on: equal bits, output by output; returns the pointer run's outputs."""
    import tik_kernels.ops.attention as A

    monkeypatch.setitem(A.CONFIG, "FWD_TMA", 0)
    ref = run()
    monkeypatch.setitem(A.CONFIG, "FWD_TMA", 1)
    assert all(same_bits(a, b) for a, b in zip(run(), ref, strict=True))
    return ref


def test_column_slices_of_a_fused_qkv_give_the_contiguous_bits():
    """q, k and v as column slices of one fused projection's output (rows with gaps between them, as a model
    with a stacked qkv weight passes them): forward and gradients equal bit for bit to contiguous copies'. The
    backward once wrote dk and dv with the slices' row strides into buffers allocated without the gaps."""
    import tik_kernels.ops.attention as A

    gen = torch.Generator().manual_seed(11)
    Hq, Hk, D = 4, 2, 16
    cu = torch.tensor([0, 7, 26, 38], dtype=torch.int32)
    qkv = torch.randn(38, (Hq + 2 * Hk) * D, generator=gen).to(torch.bfloat16)
    q, k, v = (t.view(38, -1, D) for t in qkv.split([Hq * D, Hk * D, Hk * D], dim=-1))
    assert not k.is_contiguous() and not v.is_contiguous()

    def fwd(q, k, v):
        return A.attention_varlen(q, k, v, cu, max_seqlen=19)

    def sliced(q, k, v):  # the leaves are contiguous clones: slice a fresh fused tensor built from them
        fused = torch.cat([t.reshape(38, -1) for t in (q, k, v)], dim=-1)
        qs, ks, vs = (t.view(38, -1, D) for t in fused.split([Hq * D, Hk * D, Hk * D], dim=-1))
        return fwd(qs, ks, vs)

    got = _forward_and_grads(sliced, q, k, v)
    want = _forward_and_grads(fwd, q.contiguous(), k.contiguous(), v.contiguous())
    assert all(same_bits(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("one_loop", [1, 0])
def test_gpu_column_slices_of_a_fused_qkv_give_the_contiguous_bits(one_loop, monkeypatch):
    """As the test above at a real shape (Hq=16, Hk=8, D=128, packed 300 + 1000 + 256: the last sequence ends on the
    128-key grid, so its last block is whole and, with FWD_ONE_LOOP, read through TMA, the storage's last row with
    it): forward and gradients equal bit for bit to contiguous copies', and near a float64 reference."""
    import tik_kernels.ops.attention as A

    monkeypatch.setitem(A.CONFIG, "FWD_ONE_LOOP", one_loop)
    gen = torch.Generator("cuda").manual_seed(13)
    Hq, Hk, D = 16, 8, 128
    cu = torch.tensor([0, 300, 1300, 1556], dtype=torch.int32, device="cuda")
    T = int(cu[-1])
    qkv = torch.randn(T, (Hq + 2 * Hk) * D, generator=gen, device="cuda").to(torch.bfloat16)
    q, k, v = (t.view(T, -1, D) for t in qkv.split([Hq * D, Hk * D, Hk * D], dim=-1))

    def fwd(q, k, v):
        return A.attention_varlen(q, k, v, cu, max_seqlen=1000)

    def sliced(q, k, v):
        fused = torch.cat([t.reshape(T, -1) for t in (q, k, v)], dim=-1)
        return fwd(*(t.view(T, -1, D) for t in fused.split([Hq * D, Hk * D, Hk * D], dim=-1)))

    got = _forward_and_grads(sliced, q, k, v)
    want = _forward_and_grads(fwd, q.contiguous(), k.contiguous(), v.contiguous())
    assert all(same_bits(a, b) for a, b in zip(got, want, strict=True))
    # the oracle makes its masks on the host; 5e-2: the contract's max_abs (tik_kernels/contracts/attention.py)
    exact = ref.attention_varlen(*(t.double().cpu() for t in (q, k, v)), cu.cpu())
    assert (got[0].double().cpu() - exact).abs().max() < 5e-2


def test_a_kv_descriptor_reaches_the_last_row_of_a_column_slice():
    """A TMA descriptor over K or V as a column slice of a fused qkv holds every position, the last included: the
    slice's last row ends before the storage does, and counting whole row strides once left it out (a TMA load there
    reads zeros). Packed [T, H, D] and [B, S, H, D] slices, and a [B, H, S, D] tensor for the other branch."""
    import tik_kernels.ops.attention as A

    if A.TensorDescriptor is None:
        pytest.skip("this Triton has no host TMA descriptors")
    T, Hq, Hk, D = 38, 4, 2, 16
    fused = torch.zeros(T, (Hq + 2 * Hk) * D, dtype=torch.bfloat16)
    for k in fused.split([Hq * D, Hk * D, Hk * D], dim=-1)[1:]:
        desc, (rb, rh, ch) = A._kv_descriptor(k.view(T, Hk, D), True, 4)
        assert desc.shape[0] == T and (rb, rh, ch) == (0, 0, D)
    fused_b = torch.zeros(2, 19, (Hq + 2 * Hk) * D, dtype=torch.bfloat16)
    v = fused_b.split([Hq * D, Hk * D, Hk * D], dim=-1)[2].view(2, 19, Hk, D).transpose(1, 2)  # [B, H, S, D] view
    desc, (rb, rh, ch) = A._kv_descriptor(v, False, 4)
    assert desc.shape[0] == 2 * 19 and (rb, rh, ch) == (19, 0, D)
    dense = torch.zeros(2, Hk, 19, D, dtype=torch.bfloat16)
    desc, (rb, rh, ch) = A._kv_descriptor(dense, False, 4)
    assert desc.shape[0] == 2 * Hk * 19 and (rb, rh, ch) == (Hk * 19, 19, 0)


@pytest.mark.parametrize("layout", ["bhsd", "bshd", "packed"])
def test_fwd_tma_gives_the_pointer_bits(layout, monkeypatch):
    """FWD_TMA reads the unmasked walk's K and V blocks through descriptors: the same bits as pointer loads for
    [B, H, S, D], [B, S, H, D] (a transposed view) and packed layouts, forward and gradients; a descriptor
    pointing one head off is seen (the descriptor path is the one that ran)."""
    import tik_kernels.ops.attention as A

    gen = torch.Generator().manual_seed(7)
    Hq, Hk, D = 4, 2, 16
    if layout == "packed":
        lens, cu = [7, 19, 12], torch.tensor([0, 7, 26, 38], dtype=torch.int32)
        q, k, v = (torch.randn(38, h, D, generator=gen).to(torch.bfloat16) for h in (Hq, Hk, Hk))

        def fwd(q, k, v):
            return A.attention_varlen(q, k, v, cu, max_seqlen=max(lens))
    else:
        q = torch.randn(2, Hq, 19, D, generator=gen).to(torch.bfloat16)
        k, v = (torch.randn(2, Hk, 19, D, generator=gen).to(torch.bfloat16) for _ in range(2))
        if layout == "bshd":
            k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (k, v))
        fwd = A.attention_prefill
    assert A._kv_descriptor(k, layout == "packed", 4) is not None

    def run():
        return _forward_and_grads(fwd, q, k, v)

    ref = _tma_matches_pointers(run, monkeypatch)
    real = A._kv_descriptor

    def off_by_a_head(t, varlen, block_n):
        desc, (rb, rh, ch) = real(t, varlen, block_n)
        return desc, (rb, rh, ch + D) if ch else (rb, rh + 1, ch)

    monkeypatch.setattr(A, "_kv_descriptor", off_by_a_head)
    assert not same_bits(run()[0], ref[0])


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True])
def test_fwd_tma_gives_the_pointer_bits_on_gpu(packed, monkeypatch):
    """On the H200, FWD_TMA: forward and gradients equal bit for bit with pointer loads at a real GQA shape."""
    import tik_kernels.ops.attention as A

    gen = torch.Generator(device="cuda").manual_seed(11)
    Hq, Hk, D, S = 32, 8, 128, 3000
    if packed:
        cu = torch.tensor([0, 700, 3000, 4100], dtype=torch.int32, device="cuda")
        q, k, v = (torch.randn(4100, h, D, generator=gen, device="cuda").to(torch.bfloat16) for h in (Hq, Hk, Hk))

        def fwd(q, k, v):
            return A.attention_varlen(q, k, v, cu, max_seqlen=2300)
    else:
        q = torch.randn(1, Hq, S, D, generator=gen, device="cuda").to(torch.bfloat16)
        k, v = (torch.randn(1, Hk, S, D, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
        fwd = A.attention_prefill
    assert A._kv_descriptor(k, packed, 128) is not None
    _tma_matches_pointers(lambda: _forward_and_grads(fwd, q, k, v), monkeypatch)


def test_the_gluon_forward_is_chosen_only_where_it_applies(monkeypatch):
    """`_gluon_applies` (ops/attention_gluon.py's kernel instead of the Triton forward): never under the interpreter,
    never with FWD_GLUON off, packed sequences only with FWD_GLUON_VARLEN too, and only bf16 at head dim 128 on a
    CUDA tensor (a Hopper GPU's, which the GPU tests check)."""
    from tik_kernels.ops import attention as root

    q = torch.empty(1, 2, 3, 128, dtype=torch.bfloat16)
    on = {**root.CONFIG, "FWD_GLUON": 1, "FWD_GLUON_VARLEN": 1}
    assert not root._gluon_applies(q, on)  # the interpreter (this machine)
    monkeypatch.setattr(root, "INTERPRET", False)
    calls = []
    monkeypatch.setattr(root.torch.cuda, "get_device_capability", lambda d=None: calls.append(d) or (9, 0))
    for cfg, t, varlen in [({**on, "FWD_GLUON": 0}, q, False), ({**on, "FWD_GLUON_VARLEN": 0}, q, True),
                           (on, q.half(), False), (on, q[..., :64], False), (on, q, False)]:
        assert not root._gluon_applies(t, cfg, varlen)
    assert not calls  # every refusal above came before the device was asked
    assert root.TUNABLE_WHEN["FWD_GLUON_VARLEN"] == {"FWD_GLUON": (1,)}
    assert root.CONFIG["FWD_GLUON"] in root.TUNABLES["FWD_GLUON"]
