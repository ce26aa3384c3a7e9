"""Contract of unified causal GQA attention: `attention_prefill`, `attention_decode`, `attention_varlen`.

Frozen. The relations that let a rollout's log-probs be the trainer's, raw bits (`view(int16)`):

* decode_matches_prefill — `attention_decode` of the query at position t, against a cache holding keys 0..t
  (and stale keys, then NaN, past them), equals row t of `attention_prefill` over the whole sequence; checked at
  every answer position of every sequence (and at early positions around KV-block and chunk edges), lengths
  mixed within a decode batch; the decode batches are small, so decode splits the keys into chunks computed by
  separate programs and merged by a second kernel, while prefill merges the same chunks inside one program;
* prefix_matches_full — a prompt-only prefill equals the prompt rows of the prompt + answer prefill, for
  prefixes that end inside, at and past KV-block and chunk edges;
* batch_invariance — a sequence has the same bits whatever else is in the batch (subsets, permutations,
  repeats), in prefill and in decode;
* varlen_matches_dense — packed sequences (`attention_varlen`) equal each sequence's dense prefill rows,
  forward and gradients;
* determinism (forward and backward reruns), inputs unchanged, accuracy against float64, gradients against
  float64 autograd, and the root's bits (forward, decode, packed, gradients) preserved exactly.

Inputs: bf16 q, k, v ~ N(0, amp²), amp 1 and 3 (3 makes the softmax sharp, so the running-max rescale is
exercised), one shape with an explicit softmax scale. Tolerances (against float64): the kernel rounds p to
bf16 before both dots and the output to bf16; measured rel_rms ≤ 3.9e-3 in the interpreter (amp 1 and 3);
max-abs 5e-2 × amp (output rounding is relative: 0.062 measured at amp 3, 0.012 at amp 1), times
`mirror_scale` on a shape with mirrored chunks, whose values are that much larger (the CPU sharp shape: rel_rms
4.2e-3 prefill, 4.5e-3 decode, max-abs 32 where values are ~3e3). rel_rms 1e-2
leaves ~3× margin; a softmax scale off by 20% or one extra key in the causal mask costs more. Gradients
(bf16 dq/dk/dv, fp32 accumulation, delta from the bf16 output as in FlashAttention): rel_rms 5e-3 at amp 1,
2.3e-2 on the sharp shape (near one-hot softmax: dp - delta cancels); bound 4e-2.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tik_kernels.contract import (
    ROOT_BITS_REQUIREMENT,
    BenchCase,
    Cell,
    Contract,
    Plan,
    Probe,
    Requirement,
    Results,
    Tolerance,
    accurate,
    bitwise_equal,
    inputs_unchanged,
)
from tik_kernels.models import QWEN3_0_6B, QWEN3_8B
from tik_kernels.reference import attention as ref

TOL = Tolerance(rel_rms=1e-2, max_abs=5e-2)
GRAD_TOL = Tolerance(rel_rms=4e-2)


def _tol(sh: Shape) -> Tolerance:
    """max-abs scales with the values' magnitude (bf16 output rounding is relative)."""
    return Tolerance(rel_rms=TOL.rel_rms, max_abs=TOL.max_abs * max(1.0, sh.amp) * (sh.mirror_scale if sh.mirror
                                                                                      else 1.0))


@dataclass(frozen=True)
class Shape:
    """One input configuration: heads, head dim, a batch of B prompt + answer sequences."""

    name: str
    hq: int
    hk: int
    d: int
    batch: int
    prompt: int
    answer: int
    amp: float = 1.0
    scale: float | None = None
    #: cache capacity past the sequence (filled with NaN: never to be read)
    cache_pad: int = 5
    #: prompt-only prefill lengths checked against the full prefill
    prefixes: tuple[int, ...] = ()
    #: decode positions checked besides every answer position
    early: tuple[int, ...] = ()
    #: query rows whose accuracy is checked (None: all)
    acc_rows: int | None = None
    #: (batch, length) of the backward probe (None: the full batch)
    grad_shape: tuple[int, int] | None = None
    #: decode at every position of every sequence (tiny shapes), not only the answer and `early`
    every_position: bool = False
    #: keys of one chunk (0: off). Chunk 3 repeats chunk 2's keys with negated values, scaled by `mirror_scale`:
    #: the two chunk states then cancel exactly when merged one after the other (chunk 0, 1, 2, 3, ... in
    #: sequence) and leave an fp32 rounding error of the scaled values in any other order (reversed, pairwise),
    #: large enough to show in bf16 outputs; unstructured inputs hide a reordered merge below bf16 rounding
    mirror: int = 0
    mirror_scale: float = 1024.0

    @property
    def seq(self) -> int:
        return self.prompt + self.answer


def shapes(profile: str) -> list[Shape]:
    if profile == "cpu":
        # in the interpreter a KV block is 4 keys and a chunk 2 blocks (8 keys): 16 keys span two chunks, every
        # position decoded; the sharp shape's 34 keys span five (the last partial) with mirrored chunks 2 and 3,
        # so a merge order that is not chunk 0, 1, 2, ... in sequence (reversed, pairwise) changes bits;
        # prefixes and early decode positions end inside, at and past block and chunk edges
        return [
            Shape("gqa[Hq=4,Hk=2,D=32]", 4, 2, 32, batch=3, prompt=10, answer=6, prefixes=(1, 7, 8, 9, 10),
                  every_position=True),
            Shape("sharp[Hq=4,Hk=2,D=16,scale=0.3]", 4, 2, 16, batch=2, prompt=30, answer=4, amp=3.0, scale=0.3,
                  prefixes=(3, 16, 17, 30), early=(0, 3, 4, 7, 8, 15, 16, 23, 24, 25), grad_shape=(1, 19),
                  mirror=8),
        ]
    if profile == "gpu":
        # KV block 128, chunk 512 keys on the GPU: prefixes and early positions at block and chunk edges
        return [
            Shape(f"{QWEN3_8B.name}[Hq=32,Hk=8,D=128]", QWEN3_8B.n_heads, QWEN3_8B.n_kv_heads, QWEN3_8B.head_dim,
                  batch=2, prompt=3968, answer=128, cache_pad=64,
                  prefixes=(1, 127, 128, 129, 511, 512, 513, 2047, 3968),
                  early=(0, 1, 127, 128, 511, 512, 513, 1000, 1023, 1024, 2560), acc_rows=96, grad_shape=(2, 333)),
            Shape(f"{QWEN3_0_6B.name}[Hq=16,Hk=8,D=128,amp=3]", QWEN3_0_6B.n_heads, QWEN3_0_6B.n_kv_heads,
                  QWEN3_0_6B.head_dim, batch=3, prompt=1001, answer=128, amp=3.0, cache_pad=64,
                  prefixes=(129, 512, 1001), early=(0, 64, 500, 511, 512), acc_rows=96, grad_shape=(1, 700)),
        ]
    raise ValueError(f"unknown profile {profile!r}")


def _qkv(B: int, hq: int, hk: int, S: int, d: int, amp: float, gen: torch.Generator, device: str = "cpu"):
    def r(h: int) -> torch.Tensor:
        return (torch.randn(B, h, S, d, generator=gen, device=device) * amp).to(torch.bfloat16)

    return r(hq), r(hk), r(hk)


def _cache(B: int, h: int, S: int, d: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """A [B, h, S, d] bf16 KV cache of standard normals, drawn a sequence at a time: drawn whole in float32 the
    largest decode cell's (B 128, L 32768) took 16 GiB for one draw beside the timing child's other input sets, and ran
    an H100 out of memory (results/eval_rate_h100_s36_before.log)."""
    out = torch.empty(B, h, S, d, dtype=torch.bfloat16, device=device)
    for b in range(B):
        out[b] = torch.randn(h, S, d, generator=gen, device=device)
    return out


def _pack(parts: list[torch.Tensor]) -> torch.Tensor:
    """[H, n_i, D] pieces -> packed token-major [sum n_i, H, D]."""
    return torch.cat([p.transpose(0, 1) for p in parts]).contiguous()


def _same(res_out: list[torch.Tensor], expected: torch.Tensor, what: str) -> tuple:
    if len(res_out) < 1:
        return False, f"{what}: no output"
    return bitwise_equal(res_out[0], expected, what)


def _build_shape(plan: Plan, sh: Shape, gen: torch.Generator) -> None:
    p = sh.name + "/"
    B, S, P, A = sh.batch, sh.seq, sh.prompt, sh.answer
    kw = {} if sh.scale is None else {"scale": sh.scale}
    q, k, v = _qkv(B, sh.hq, sh.hk, S, sh.d, sh.amp, gen)
    if sh.mirror:
        c = sh.mirror
        v[:, :, 2 * c:3 * c] *= sh.mirror_scale  # a power of two: exact in bf16
        k[:, :, 3 * c:4 * c], v[:, :, 3 * c:4 * c] = k[:, :, 2 * c:3 * c], -v[:, :, 2 * c:3 * c]
    full = plan.add(Probe(p + f"prefill[B={B},S={S}]", "attention_prefill", (q, k, v), dict(kw), echo_inputs=True))
    again = plan.add(Probe(p + "prefill/rerun", "attention_prefill", (q, k, v), dict(kw)))

    def determinism(res: Results, a=again, f=full):
        ok, detail, d = bitwise_equal(res[a][0], res[f][0], "output")
        return ok, ("rerun bitwise identical" if ok else "rerun differs: " + detail), d

    plan.check(p + "determinism", "determinism", determinism)

    def unchanged(res: Results, pid: str, sent: tuple) -> tuple:
        return inputs_unchanged(res.inputs_after(pid), sent)

    plan.check(p + "inputs_unchanged[prefill]", "inputs_unchanged",
               lambda res, f=full, a=(q, k, v): unchanged(res, f, a))

    # prompt-only prefills vs the prompt rows of the full one
    for n in sorted(set(sh.prefixes)):
        args = tuple(t[:, :, :n].contiguous() for t in (q, k, v))
        pid = plan.add(Probe(p + f"prefix[S={n}]", "attention_prefill", args, dict(kw)))
        plan.check(p + f"prefix_matches_full[S={n}]", "prefix_matches_full",
                   lambda res, pid=pid, f=full, n=n: _same(res[pid], res[f][0][:, :, :n], f"rows 0..{n - 1}"))

    # batch composition: one sequence alone, and a permutation with a repeat
    for label, idx in (("single", [B - 1]), ("permuted", [B - 1] + list(range(B - 1)) + [0])):
        idx_t = torch.tensor(idx)
        pid = plan.add(Probe(p + f"prefill/{label}", "attention_prefill", tuple(t[idx_t] for t in (q, k, v)),
                             dict(kw)))
        plan.check(p + f"batch_invariance[prefill {label} {idx}]", "batch_invariance",
                   lambda res, pid=pid, f=full, i=idx_t: _same(res[pid], res[f][0][i], "sequences"))

    # a KV cache of capacity S + pad: keys 0..S-1 then NaN; entries past lens are stale or NaN
    cap = S + sh.cache_pad
    kc = torch.full((B, sh.hk, cap, sh.d), float("nan"), dtype=torch.bfloat16)
    vc = kc.clone()
    kc[:, :, :S], vc[:, :, :S] = k, v
    rows = torch.arange(B)
    positions = [[P + (i + 37 * b) % A for b in range(B)] for i in range(A)]
    if sh.every_position:
        positions = [[(i + 5 * b) % S for b in range(B)] for i in range(S)]
    positions += [[e] * B for e in sh.early]
    decode_ids, first_args = [], None
    for i, pos in enumerate(positions):
        pos_t = torch.tensor(pos)
        lens = (pos_t + 1).to(torch.int32)
        qd = q[rows, :, pos_t][:, :, None].contiguous()
        pid = plan.add(Probe(p + f"decode[{i}] pos={pos}", "attention_decode", (qd, kc, vc, lens), dict(kw),
                             echo_inputs=i == 0))
        decode_ids.append((pid, pos_t))
        first_args = first_args or (qd, kc, vc, lens)

    def decode_matches(res: Results, ids=decode_ids, f=full):
        out = res[f][0]
        for pid, pos_t in ids:
            ok, detail, d = _same(res[pid], out[rows, :, pos_t][:, :, None], f"decode at positions {pos_t.tolist()}")
            if not ok:
                return False, detail, d
        return True, f"{len(ids)} decode batches ({len(ids) * B} positions) bitwise equal to prefill rows", 0.0

    plan.check(p + "decode_matches_prefill", "decode_matches_prefill", decode_matches)
    d0, pos0 = decode_ids[0]
    plan.check(p + "inputs_unchanged[decode]", "inputs_unchanged",
               lambda res, d0=d0, a=first_args: unchanged(res, d0, a))

    idx_t = torch.tensor([B - 1, 0, B - 1])
    pos_t = torch.tensor([P + A - 1, P, P + A // 2])
    qd = q[idx_t, :, pos_t][:, :, None].contiguous()
    pid = plan.add(Probe(p + "decode/permuted", "attention_decode",
                         (qd, kc[idx_t], vc[idx_t], (pos_t + 1).to(torch.int32)), dict(kw)))
    plan.check(p + "batch_invariance[decode permuted]", "batch_invariance",
               lambda res, pid=pid, f=full, i=idx_t, t=pos_t: _same(res[pid], res[f][0][i, :, t][:, :, None],
                                                                    "decode rows"))

    # packed sequences of different lengths vs their dense prefill rows
    lengths = [S, P, 1, max(2, P // 2)]
    src = [j % B for j in range(len(lengths))]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    packed = tuple(_pack([t[b, :, :n] for b, n in zip(src, lengths, strict=True)]) for t in (q, k, v))
    vid = plan.add(Probe(p + f"varlen{lengths}", "attention_varlen", (*packed, cu), dict(kw), echo_inputs=True))

    def varlen_matches(res: Results, vid=vid, f=full):
        want = _pack([res[f][0][b, :, :n] for b, n in zip(src, lengths, strict=True)])
        ok, detail, d = _same(res[vid], want, "packed rows")
        return ok, (f"{len(lengths)} packed sequences {lengths} bitwise equal to dense rows" if ok else detail), d

    plan.check(p + "varlen_matches_dense", "varlen_matches_dense", varlen_matches)
    plan.check(p + "inputs_unchanged[varlen]", "inputs_unchanged",
               lambda res, vid=vid, a=(*packed, cu): unchanged(res, vid, a))

    # accuracy of prefill rows and of one decode batch against float64
    acc_rows = torch.arange(S)
    if sh.acc_rows is not None and sh.acc_rows < S:
        acc_rows = torch.cat([torch.tensor([0, S - 1]), torch.randperm(S, generator=gen)[: sh.acc_rows - 2]]).sort()[0]
    want = ref.attention_prefill(q, k, v, sh.scale, rows=acc_rows)
    plan.check(p + "accuracy[prefill]", "accuracy",
               lambda res, f=full, r=acc_rows, w=want: accurate(res[f][0][:, :, r], w, _tol(sh), f"{len(r)} rows"))
    want_d = ref.attention_decode(q[rows, :, pos0][:, :, None], kc, vc, pos0 + 1, sh.scale)
    plan.check(p + "accuracy[decode]", "accuracy",
               lambda res, d0=d0, w=want_d: accurate(res[d0][0], w, _tol(sh), "decode"))

    # backward: dense and packed, vs float64 autograd, rerun, and packed grads == dense grads
    gb, gs = sh.grad_shape or (B, S)
    gq, gk, gv = _qkv(gb, sh.hq, sh.hk, gs, sh.d, sh.amp, gen)
    go = torch.randn(gq.shape, generator=gen).to(torch.bfloat16)
    gid = plan.add(Probe(p + f"backward[B={gb},S={gs}]", "attention_prefill", (gq, gk, gv), dict(kw),
                         grad_args=(0, 1, 2), grad_outputs=(go,)))
    rid = plan.add(Probe(p + "backward/rerun", "attention_prefill", (gq, gk, gv), dict(kw), grad_args=(0, 1, 2),
                         grad_outputs=(go,)))
    a64 = [t.double().requires_grad_(True) for t in (gq, gk, gv)]
    ref.attention_prefill(*a64, sh.scale).backward(go.double())
    ref_g = [t.grad for t in a64]

    def gradient(res: Results, gid=gid, ref_g=ref_g):
        got = res[gid][1:]
        if len(got) != 3:
            return False, f"{len(got)} gradients, expected 3"
        worst, details = 0.0, []
        for name, g, r in zip(("dq", "dk", "dv"), got, ref_g, strict=True):
            ok, detail, d = accurate(g, r, GRAD_TOL, name)
            if not ok:
                return False, detail, d
            worst, details = max(worst, d), details + [detail]
        return True, "; ".join(details), worst

    plan.check(p + "gradient", "gradient", gradient)

    def grad_rerun(res: Results, a=gid, b=rid):
        for i, (x, y) in enumerate(zip(res[a], res[b], strict=True)):
            ok, detail, d = bitwise_equal(x, y, f"output {i}")
            if not ok:
                return False, "backward rerun differs: " + detail, d
        return True, "output and dq, dk, dv bitwise identical on rerun", 0.0

    plan.check(p + "grad_determinism", "determinism", grad_rerun)

    g_len = [gs, max(1, gs // 2) + 1]
    g_src = [j % gb for j in range(len(g_len))]
    g_cu = torch.tensor([0] + torch.tensor(g_len).cumsum(0).tolist(), dtype=torch.int32)
    g_packed = tuple(_pack([t[b, :, :n] for b, n in zip(g_src, g_len, strict=True)]) for t in (gq, gk, gv))
    g_go = _pack([go[b, :, :n] for b, n in zip(g_src, g_len, strict=True)])
    gvid = plan.add(Probe(p + f"varlen_backward{g_len}", "attention_varlen", (*g_packed, g_cu), dict(kw),
                          grad_args=(0, 1, 2), grad_outputs=(g_go,)))
    # a dense backward of the second packed sequence on its own, to compare its gradients bit for bit
    b1, n1 = g_src[1], g_len[1]
    sid = plan.add(Probe(p + f"backward[S={n1}]", "attention_prefill",
                         tuple(t[b1:b1 + 1, :, :n1].contiguous() for t in (gq, gk, gv)), dict(kw),
                         grad_args=(0, 1, 2), grad_outputs=(go[b1:b1 + 1, :, :n1].contiguous(),)))

    def varlen_grads(res: Results, gvid=gvid, gid=gid, sid=sid):
        got = res[gvid]
        dense0, dense1 = res[gid], res[sid]
        n0 = g_len[0]
        for i, name in ((0, "output"), (1, "dq"), (2, "dk"), (3, "dv")):
            want = torch.cat([dense0[i][g_src[0], :, :n0].transpose(0, 1), dense1[i][0].transpose(0, 1)])
            ok, detail, d = bitwise_equal(got[i], want.contiguous(), f"packed {name}")
            if not ok:
                return False, detail, d
        return True, f"packed output and gradients ({g_len}) bitwise equal to dense", 0.0

    plan.check(p + "varlen_matches_dense[backward]", "varlen_matches_dense", varlen_grads)

    for pid in (full, d0, vid, gid, gvid):

        def root_bits(res: Results, pid=pid):
            outs, root = res[pid], res.root(pid)
            if len(outs) != len(root):
                return False, f"{len(outs)} outputs, root has {len(root)}"
            for i, (x, y) in enumerate(zip(outs, root, strict=True)):
                ok, detail, d = bitwise_equal(x, y, f"output {i}")
                if not ok:
                    return False, "differs from root: " + detail, d
            return True, f"{len(outs)} outputs bitwise equal to the root's", 0.0

        plan.check(p + f"root_bits[{pid.split('/', 1)[1]}]", "root_bits", root_bits)


def build_plan(profile: str, seed: int) -> Plan:
    plan = Plan(needs_root=True)
    rng = torch.Generator().manual_seed(seed)
    for sh in shapes(profile):
        gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,), generator=rng)))
        _build_shape(plan, sh, gen)
    return plan


# ----------------------------------------------------------------------------- workload cells

PREFILL = ((1, 1024), (4, 1024), (1, 4096), (4, 4096), (1, 16384))
#: decode as rollouts hit it: a few long reasoning sequences up to large batches, contexts up to 32k
DECODE = tuple((B, L) for B in (1, 8, 32, 128) for L in (1024, 2048, 4096, 8192, 16384, 32768))
#: the second head layout, a few cells across the same range
DECODE_SMALL = ((1, 4096), (1, 32768), (8, 8192), (32, 16384), (128, 4096))


#: a decode cell whose KV cache is at least this large is timed on one input variant (`cells`)
LARGE_KV_BYTES = 4 << 30


def cells(profile: str) -> list[Cell]:
    """Prefill (= training forward) and decode per model head layout, coefficient 1.0 each (AReaL-TIK's choice)."""
    if profile == "cpu":
        return [Cell("cpu/prefill[B=2,S=16,Hq=4,Hk=2,D=32]", {"kind": "prefill", "B": 2, "S": 16, "hq": 4, "hk": 2,
                                                              "d": 32}),
                Cell("cpu/decode[B=2,L=16,Hq=4,Hk=2,D=32]", {"kind": "decode", "B": 2, "S": 16, "hq": 4, "hk": 2,
                                                             "d": 32})]
    out = []
    for m in (QWEN3_8B, QWEN3_0_6B):
        heads = {"hq": m.n_heads, "hk": m.n_kv_heads, "d": m.head_dim}
        for B, S in PREFILL:
            out.append(Cell(f"{m.name}/prefill[B={B},S={S}]", {"kind": "prefill", "B": B, "S": S, **heads}))
        for B, L in DECODE if m is QWEN3_8B else DECODE_SMALL:
            # a KV cache of GiBs is far past any L2: one input variant (`Cell.variants`), one copy fewer on the
            # device (the 16 GiB of B 128 x L 32768: three copies ran an H100's timing child out of memory)
            kv_bytes = 2 * B * L * m.n_kv_heads * m.head_dim * 2
            out.append(Cell(f"{m.name}/decode[B={B},L={L}]", {"kind": "decode", "B": B, "S": L, **heads},
                            variants=1 if kv_bytes >= LARGE_KV_BYTES else None))
    return out


def bench_case(cell: Cell, seed: int, device: str) -> BenchCase:
    c = cell.params
    B, S, hq, hk, d = c["B"], c["S"], c["hq"], c["hk"], c["d"]
    gen = torch.Generator(device).manual_seed(seed)
    if c["kind"] == "prefill":
        q, k, v = _qkv(B, hq, hk, S, d, 1.0, gen, device)
        return BenchCase(
            entry="attention_prefill",
            args=(q, k, v),
            baseline=lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
            bytes_moved=(2 * q.numel() + k.numel() + v.numel()) * q.element_size(),
            flops=2 * B * hq * S * S * d,
        )
    q, _, _ = _qkv(B, hq, hk, 1, d, 1.0, gen, device)
    kc, vc = _cache(B, hk, S, d, gen, device), _cache(B, hk, S, d, gen, device)
    # mixed lengths, as in a rollout batch: each sequence a little shorter than the cache
    lens = (S - (torch.arange(B, device=device) * 37) % max(1, min(64, S // 2))).to(torch.int32)
    mask = (torch.arange(S, device=device)[None, :] < lens[:, None])[:, None, None, :]
    return BenchCase(
        entry="attention_decode",
        args=(q, kc, vc, lens),
        baseline=lambda: F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True),
        bytes_moved=(kc.numel() + vc.numel() + 2 * q.numel()) * q.element_size(),
        flops=4 * B * hq * S * d,
    )


REQUIREMENTS = (
    Requirement("decode_matches_prefill", "bitwise",
                "decode of the query at position t equals prefill row t (every answer position, mixed lengths)"),
    Requirement("prefix_matches_full", "bitwise", "a prompt-only prefill equals the prompt rows of prompt + answer"),
    Requirement("batch_invariance", "bitwise", "a sequence's bits do not depend on the rest of the batch"),
    Requirement("varlen_matches_dense", "bitwise", "packed sequences equal their dense prefill, forward and backward"),
    Requirement("determinism", "determinism", "forward and backward reruns give the same bits"),
    Requirement("inputs_unchanged", "inputs_unchanged", "prefill, decode and varlen leave their inputs unchanged"),
    Requirement("accuracy", "accuracy", "prefill and decode within tolerance of float64"),
    Requirement("gradient", "gradient", "dq, dk, dv within tolerance of float64 autograd"),
    dataclasses.replace(ROOT_BITS_REQUIREMENT,
                        description="prefill, decode, packed outputs and gradients bitwise equal to the root's"),
)

CONTRACT = Contract(
    op="attention",
    entries=("attention_prefill", "attention_decode", "attention_varlen"),
    impl="tik_kernels.ops.attention",
    summary="causal GQA attention: prefill / packed training forward (+backward) and KV-cache decode, bitwise equal",
    requirements=REQUIREMENTS,
    tolerances={"forward": TOL, "gradient": GRAD_TOL},
    build_plan=build_plan,
    cells=cells,
    bench_case=bench_case,
    preserve_root_bits=True,
    frozen_tunables=frozenset({"BLOCK_N", "CHUNK_BLOCKS", "BLOCK_N_INTERPRET", "CHUNK_BLOCKS_INTERPRET", "DQ_BLOCK_N",
                               "DKDV_BLOCK_M"}),
)
