"""linear(x[T, K], w[N, K]) -> x @ w.T, bf16 in and out, fp32 accumulation, batch-invariant.

The reduction tree is fixed; who computes which part of it is free.

The tree (frozen: BLOCK_K, KCHUNK, the merge order, one rounding). K is cut into chunks of
KCHUNK = 2048 (the last one partial when K is no multiple of it; the masked tail adds exact
zeros). Each chunk is summed K-sequentially from a fresh fp32 accumulator: one tl.dot per BLOCK_K
slice, k = chunk start, + BLOCK_K, ... in order. The chunk sums are then added left to right in
fp32, total = ((0 + s_0) + s_1) + ... + s_{n-1}, and the total is rounded to the output dtype
once. Nothing in that tree depends on M, the tile or the launch: KCHUNK and BLOCK_K are
constants, never functions of the token count. 2048 divides every K of the Qwen3 / Llama-3
projections (4096, 12288, 14336) and of their backward (N = 4096 ... 28672), so only the tokens of
dw end on a partial chunk; it gives 2 chunks at K = 4096 (with narrow tiles, enough programs for
decode, see below) and costs a large-M program one wait for its MMAs in flight per 32 BLOCK_K steps.
Timed against 1024 on the H200 with each one's best launches, 2048 was faster at 31 of 35 cells.

One rule gives a narrow output other chunks (frozen as KCHUNK): a product with at most NARROW_N = 2048
output columns (a weight of at most that many rows: a small model's o and down projections) cuts K
into chunks of NARROW_KCHUNK = 1024 instead (`_kchunk`). N is the weight's side of the product, the
same for every batch, so the tree still never follows the tokens: a decode step and the trainer's
forward reduce such a weight the same way. It is for decode: a 1024-wide output over K = 2048 is one
chunk of 32 sequential BLOCK_K steps in each of a few dozen programs, a chain of latency no split can
shorten (H100: qwen3-0.6b's o projection 8.0 us at M = 64 against a 1.1 us floor, its down
projection 9.7 us); chunks of 1024 give the same output twice the programs (three times for the down
projection's K = 3072), each a shorter chain. Timed on an H100 (`gpu_pending.sh narrow`, one run,
e2e_h100_decode_narrow_s23.json): the qwen3-0.6b decode step of 64 with the host ahead 1.997 -> 1.885 ms
at context 128 and 2.303 -> 2.190 ms at 256; chunks of 512 gave 1.912 / 2.227. No Qwen3-8B projection
(N >= 4096) is touched; qwen3-0.6b's and 1.7b's o and down projections got new bits with it (session 23).

The parallelization (tunable per M bucket, none of it changes bits):
- the output tile (BLOCK_M, BLOCK_N), num_warps, num_stages, K_UNROLL (BLOCK_K slices loaded
  per loop iteration: the same dots in the same order; only for 16-row tiles on Hopper: where the MMA is wgmma, 64
  rows or more or SWAP, Triton 3.6 waits for each wgmma before the next once an iteration holds two dots, 8 waits a
  loop against 2 for K_UNROLL 1, `benchmarks/linear_offline.py`);
- SPLIT: 0 = one program per output tile walks all chunks itself, adding each chunk sum into a
  running fp32 total in registers (large M: no extra memory traffic). s > 0 = when the output
  tiles alone would give fewer than s × (number of SMs) programs, chunks get programs of their
  own (fewest chunks per program that reach that count): each writes its chunk sums, fp32, to a
  workspace [n_chunks, M, N], and the tile's chunk sums are added in the same left-to-right
  order by `_sum_chunks`, from the same fp32 values, so the result is bit for bit the one-program
  result. A program with several chunks still writes each chunk's sum on its own: adding them
  first would make the tree follow the split. Both paths run one chunk through the same loop
  code, so the compiler cannot treat a chunk differently when it is walked or split. Decode-size
  linear streams the weights, and needs many programs to do it at HBM speed (the interpreter
  assumes the H200's 132 SMs, so it takes the same decisions at the same shape);
- FUSED_COMBINE: who runs `_sum_chunks` after a split: 1 = the last program of a tile to
  finish (an arrival counter per tile, reset by that program: one launch, nothing to wait on),
  0 = a second kernel over the whole output. FUSED_MAX_M: the fused combine only up to this many
  rows, the second kernel above (H200: fused 3% faster at M <= 16, the kernel 3-10% faster at
  M = 64, linear_sweep_h200_k2048/, linear_sweep_h200_m64/).
- WIDE_WAVES: a mid-size M (M256, M1024 buckets) whose output is so wide (lm_head, gate_up) that the
  MBIG tile gives that many waves of programs on its own launches with the MBIG tile (H200: lm_head
  at M = 256 1.50x -> 1.15x cuBLAS; 1 wave also moved qkv at M = 1024 to 1.30x, 2 moved nothing the
  wrong way: benchmarks/results/linear_wide_waves_h200/);
- FULL_WAVE_PCT: an M256 / M1024 launch whose MBIG tiles make one wave, at least FULL_WAVE_PCT % of the SMs and no
  more than all of them, takes the MBIG tile too: Qwen3-8B's 4096-wide o and down at M = 1024 (128 tiles of
  128 x 256 on 132 SMs, where the bucket's 128 x 128 gives 256). In same-run sweeps that launch took o / down
  1.018 / 1.043x cuBLAS's time against the bucket tile's 1.131 / 1.099x (H100, linear_sweep_h100_k2048_s45/;
  1.049 / 0.960 against 1.126 / 1.053 under a 4096 tree, linear_sweep_h100_k4096_one0_s45/; H200 under an earlier
  root 1.049 / 1.033 against 1.549 / 1.445, linear_sweep_h200_k2048/), and qwen3-0.6b's qkv (N = 4096) 1.082
  against 1.176 (linear_sweep_h100_qwen3-0.6b_one0_s45/), while qkv at 192 tiles (1.45 waves) took 1.28-1.39x and
  0.6b's 1024-wide o / down at 32 tiles 2.39x, which the rule leaves alone;
- FILL_PCT with a bucket's FILL tile (M64, M256): a launch whose bucket tile would give fewer output
  tiles than FILL_PCT % of the SMs takes the FILL tile (its own BLOCK_M, BLOCK_N, warps, stages; the
  bucket's K_UNROLL and SPLIT) instead. At M = 256 a 128x128 tile with 8 warps is the fastest per SM, but
  over a 4096-wide output it gives 64 tiles, half the H200 idle; 128x64 fills it (H200 sweep of
  2026-12-04: o 1.39x -> 1.02x, down 1.46x -> 1.08x cuBLAS, while qkv and gate_up keep 128x128 at
  1.21x / 1.14x where 128x64 gave 1.51x / 1.52x: benchmarks/results/linear_sweep_h200_m64_m256/);
- NARROW_PCT: after that, while the launch would still give fewer output tiles than NARROW_PCT % of the SMs,
  BLOCK_N halves (down to 16). A small model's decode projections have narrow outputs: qwen3-0.6b's o and
  down projections at M = 64 are 1024 wide, 16 tiles of 64 x 64, and with K = 2048 (one chunk) no split
  can add programs, so 16 SMs stream the weights (H200: 8.9 us against a 1.1 us floor,
  decode_breakdown_h200_qwen3-0.6b_fill.md). No Qwen3-8B cell has so few tiles at 25 %. An M16 launch narrows
  only with M16_NARROW (off): at M = 1, 4, 16 the same 0.6b down projection (three K chunks of 1024, split) took
  0.93-0.94x cuBLAS's time with the bucket's 16 x 64 tile (48 programs) and 1.06-1.20x narrowed to 16 x 16 (192),
  o 1.18-1.28x against 1.23-1.34x, in each of three H100 sweeps (linear_sweep_h100_qwen3-0.6b_{one0,one1,swap0}_s45/:
  the entry point against its own tile as a candidate, same run);
- M16_WALK_PCT, M64_WALK_PCT (launch choices, off): a launch of the bucket that would split K (SPLIT > 0, K over more
  than one chunk) walks instead (SPLIT 0) where halving BLOCK_N, down to 32, gives at least WALK_PCT % of the SMs
  output tiles: more programs from narrower tiles cost nothing, while a split writes fp32 partials and combines them.
  On an H100 (linear_sweep_h100_qwen3-8b_swap0_s45/, M = 1, 4, 16), at the same 128 programs o's 16 x 32 walk took
  0.90-0.92x cuBLAS's time where the CONFIG's 16 x 64 split in two took 0.94-0.97x, and qkv's 16 x 64 walk (96
  programs) 0.98x where the split took 1.03-1.05x (those walks with 6 stages, the CONFIG's 4); qwen3-0.6b's
  1024-wide o and down (too few tiles of 32) keep their split, 1.3-1.5x when walked
  (linear_sweep_h100_qwen3-0.6b_swap0_s45/). At M = 64 the same sweeps walked qkv with 64 x 16 tiles at 1.07-1.08x,
  its best launch, where the CONFIG's split took 1.18x; gate_up walking 64 x 64 1.01x as its split did; o and down
  were walked only with K_UNROLL 2 (1.22-1.43x against 1.07-1.14x split), which waits on each wgmma, so M64's rule
  is a key of its own;
- PDL: launched with programmatic dependent launch (tik_kernels/ops/_common.py): the launch and the programs' start
  overlap the end of the kernel before; every program waits for it before it reads an operand;
- PREFETCH: each program first asks for the weight rows it will read to be brought into L2 (PTX prefetch, a hint that
  returns no value), and with PDL does so before that wait, while the kernel before still runs: a decode step's
  weights are no kernel's output there, and the step's small kernels leave the memory bus idle at their ends;
- TMA: operands read through tensor descriptors (Hopper's tensor-memory accelerator) instead of
  pointer tensors: the same values into the same dots, and no per-thread addresses, which leaves the
  registers for the running total beside the chunk accumulator (H200, 128x128 walking launch: 150
  registers and no spills, against 182 with pointers and 255 with 44 spills when each chunk was its
  own loop; `benchmarks/kernel_ir.py`). An operand TMA cannot read (no unit stride, rows not 16-byte
  aligned) goes through pointers; the CPU tests check both give the same bits.
- SWAP (per bucket, M16_SWAP and M64_SWAP): the tile computed transposed, c.T = w @ x.T, so the weight's BLOCK_N rows
  are the MMA's rows and the few tokens its columns. Each output element is the same dot of the same BLOCK_K slice
  into the same accumulator, k in the same order, the operands' roles swapped in a product that commutes exactly.
  For a decode-size tile (16 token rows) it is what lets Hopper use wgmma, whose rows come in 64s, instead of the
  register-fed mma (sm_90, Triton 3.6: the 16 x 64 walking launch 46 registers, no wgmma; swapped 36, its wgmmas
  pipelined with K_UNROLL 1, each waited for before the next with K_UNROLL 2; `benchmarks/linear_offline.py`), so a
  swapped launch takes K_UNROLL 1 whatever its bucket's says;
The CPU tests check every split of the same inputs gives the same bits, and against an fp32
emulation of the tree; the contract checks rows of every T against the full batch.

One flat loop runs a program's steps; a chunk's sum is handed on at its last step (added to the
total, or written to the workspace), so the compiler pipelines loads across chunk boundaries and turns
the reset into the MMA's "ignore the accumulator" flag. ONE_CHUNK (a launch choice, off): where K fits one chunk
(qwen3-0.6b's and 1.7b's qkv and gate_up projections, K = 1024 / 2048), the loop carries no running total and the
chunk's sum is added to 0 after it: the same (0 + s_0), without the total's registers held beside the accumulator
through the loop (sm_90, Triton 3.6, the launch as a forward specializes it: the 128 x 256 walking launch 255
registers and 240 / 160 B of spills a thread, three spill stores and loads on every iteration's path; with one chunk
183 registers and none, but its wgmmas serialized by ptxas (C7515); `benchmarks/linear_offline.py`). Which is why
that launch ran slower with ONE_CHUNK on an H100, the others about as fast (CONFIG's comment).

Measured on the H200 (`benchmarks/sweep_linear.py`, benchmarks/results/linear_sweep_h200_*/sweep.md):
with TMA and KCHUNK 1024 the best launch per bucket was 1.17x cuBLAS's time (geomean over 35 Qwen3-8B
cells), 1.38x with pointer loads; with KCHUNK 2048 and more candidates, 1.10x (M >= 4096 1.02-1.13x,
M <= 16 1.01x; M = 64 1.07-1.24x and M = 256 1.25-1.52x are what is left). The single-chain root this
replaced measured 1.31x (speed_h200.md), 1.26-1.30x at M >= 1024.

Triton's interpreter computes bf16 tl.dot wrongly: there (UPCAST) the operands go in as fp32,
which is exact, and tik_kernels/_interpreter.py makes the interpreter's dot sum K in order.

Backward: dx = dy @ w and dw = dy.T @ x are the same kernel on strided views (dx reduces over
N, dw over the tokens, both in the same fixed tree), so gradients are deterministic and dx rows
are batch-invariant too.

The fused combine keeps one int32 counter per output tile per device, zero between launches:
launches that overlap on two streams of one device must not both split.

`linear_silu_mul` (not the contract's entry: the rollout's MLP, off by default in tik e2e) is the walking launch
over a gate_up weight [gate | up] with a second accumulator for the up rows and silu_mul's formula as its epilogue:
linear then silu_mul's bits in one launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tik_kernels._runtime import DEFAULT_SMS, INTERPRET, sm_count
from tik_kernels.ops._common import pdl_launch, pdl_start, round_to
from tik_kernels.ops.silu_mul import silu_mul_math

try:  # Triton >= 3.4: operands described for the tensor-memory accelerator (TMA)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton reads through pointers
    TensorDescriptor = None

#: allowed values; per-bucket keys are <bucket>_<name>, buckets by the number of rows M.
#: BLOCK_K and KCHUNK are frozen (they are the reduction tree), the rest only launch it.
TUNABLES = {
    "BLOCK_K": (32, 64, 128),
    "KCHUNK": (512, 1024, 2048, 4096),
    "FUSED_COMBINE": (0, 1),
    "FUSED_MAX_M": (16, 64, 256, 1073741824),
    "TMA": (0, 1),
    "WIDE_WAVES": (0, 1, 2, 4),
    "FULL_WAVE_PCT": (0, 50, 75, 90),
    "M16_BLOCK_M": (16, 32, 64),
    "M16_BLOCK_N": (16, 32, 64, 128, 256),
    "M16_num_warps": (2, 4, 8),
    "M16_num_stages": (2, 3, 4, 5, 6, 8),
    "M16_K_UNROLL": (1, 2, 4),
    "M16_SPLIT": (0, 1, 2, 4, 8),
    "M64_BLOCK_M": (16, 32, 64, 128),
    "M64_BLOCK_N": (16, 32, 64, 128, 256),
    "M64_num_warps": (2, 4, 8),
    "M64_num_stages": (2, 3, 4, 5, 6, 8),
    "M64_K_UNROLL": (1, 2, 4),
    "M64_SPLIT": (0, 1, 2, 4, 8),
    "M256_BLOCK_M": (16, 32, 64, 128),
    "M256_BLOCK_N": (16, 32, 64, 128, 256),
    "M256_num_warps": (2, 4, 8),
    "M256_num_stages": (2, 3, 4, 5, 6, 8),
    "M256_K_UNROLL": (1, 2, 4),
    "M256_SPLIT": (0, 1, 2, 4, 8),
    "FILL_PCT": (0, 25, 50, 75, 100),
    "NARROW_PCT": (0, 12, 25, 50, 100),
    "M16_NARROW": (0, 1),
    "M16_WALK_PCT": (0, 50, 70, 100),
    "M64_WALK_PCT": (0, 50, 70, 100),
    "M64_FILL_BLOCK_M": (16, 32, 64, 128),
    "M64_FILL_BLOCK_N": (16, 32, 64, 128, 256),
    "M64_FILL_num_warps": (2, 4, 8),
    "M64_FILL_num_stages": (2, 3, 4, 5, 6, 8),
    "M256_FILL_BLOCK_M": (16, 32, 64, 128),
    "M256_FILL_BLOCK_N": (16, 32, 64, 128, 256),
    "M256_FILL_num_warps": (2, 4, 8),
    "M256_FILL_num_stages": (2, 3, 4, 5, 6, 8),
    "M1024_BLOCK_M": (16, 32, 64, 128, 256),
    "M1024_BLOCK_N": (32, 64, 128, 256),
    "M1024_num_warps": (4, 8),
    "M1024_num_stages": (2, 3, 4, 5, 6),
    "M1024_K_UNROLL": (1, 2, 4),
    "M1024_SPLIT": (0, 1, 2, 4, 8),
    "MBIG_BLOCK_M": (32, 64, 128, 256),
    "MBIG_BLOCK_N": (32, 64, 128, 256),
    "MBIG_num_warps": (4, 8),
    "MBIG_num_stages": (2, 3, 4, 5, 6),
    "MBIG_K_UNROLL": (1, 2, 4),
    "MBIG_SPLIT": (0, 1, 2, 4, 8),
    "PDL": (0, 1),
    "PREFETCH": (0, 1),
    "NARROW_N": (0, 1024, 2048, 4096),
    "NARROW_KCHUNK": (256, 512, 1024, 2048),
    "ONE_CHUNK": (0, 1),
    "M16_SWAP": (0, 1),
    "M64_SWAP": (0, 1),
}

#: keys only a path behind a gate reads ({key: {gate: values}}, a literal the tuner parses): the tuner spends no
#: evaluation on a move of one where its gate is off (the tuner's `live`)
TUNABLE_WHEN = {
    "FUSED_MAX_M": {"FUSED_COMBINE": (1,)},
    "M64_FILL_BLOCK_M": {"FILL_PCT": (25, 50, 75, 100)},
    "M64_FILL_BLOCK_N": {"FILL_PCT": (25, 50, 75, 100)},
    "M64_FILL_num_warps": {"FILL_PCT": (25, 50, 75, 100)},
    "M64_FILL_num_stages": {"FILL_PCT": (25, 50, 75, 100)},
    "M256_FILL_BLOCK_M": {"FILL_PCT": (25, 50, 75, 100)},
    "M256_FILL_BLOCK_N": {"FILL_PCT": (25, 50, 75, 100)},
    "M256_FILL_num_warps": {"FILL_PCT": (25, 50, 75, 100)},
    "M256_FILL_num_stages": {"FILL_PCT": (25, 50, 75, 100)},
    # a swapped launch reads one BLOCK_K slice an iteration (`_matmul`)
    "M16_K_UNROLL": {"M16_SWAP": (0,)},
    "M64_K_UNROLL": {"M64_SWAP": (0,)},
    # a walk replaces a split (`_tile`), and M16's narrowing is NARROW_PCT's
    "M16_WALK_PCT": {"M16_SPLIT": (1, 2, 4, 8)},
    "M64_WALK_PCT": {"M64_SPLIT": (1, 2, 4, 8)},
    "M16_NARROW": {"NARROW_PCT": (12, 25, 50, 100)},
}

#: PDL 1, PREFETCH 0: the qwen3-0.6b decode step on an H100 (bench_e2e.py --only decode, same run): 2.39 ms -> 2.28 ms
#: with programmatic dependent launch in every decode kernel, 2.40 ms with the prefetch as well
#: (benchmarks/results/e2e_h100_decode_s20.json; per call: decode_breakdown_h100_qwen3-0.6b_s20*.md).
#: chosen on the H200 by `benchmarks/sweep_linear.py --tma 1 --kchunk 2048` (best launch per bucket over the
#: Qwen3-8B projections and lm_head, benchmarks/results/linear_sweep_h200_k2048/sweep.md); KCHUNK 2048 beat 1024
#: there (1.098x vs 1.129x cuBLAS geomean, the same candidates, linear_sweep_h200_k1024/sweep.md)
CONFIG = {
    "BLOCK_K": 64,
    "KCHUNK": 2048,
    "FUSED_COMBINE": 1,
    "FUSED_MAX_M": 16,
    "TMA": 1,
    "WIDE_WAVES": 2,
    "FULL_WAVE_PCT": 75,
    "M16_BLOCK_M": 16,
    "M16_BLOCK_N": 64,
    "M16_num_warps": 4,
    "M16_num_stages": 4,
    "M16_K_UNROLL": 2,
    "M16_SPLIT": 4,
    "M64_BLOCK_M": 64,
    "M64_BLOCK_N": 64,
    "M64_num_warps": 4,
    "M64_num_stages": 6,
    "M64_K_UNROLL": 1,
    "M64_SPLIT": 2,
    "M256_BLOCK_M": 128,
    "M256_BLOCK_N": 128,
    "M256_num_warps": 8,
    "M256_num_stages": 5,
    "M256_K_UNROLL": 1,
    "M256_SPLIT": 0,
    "FILL_PCT": 50,
    "NARROW_PCT": 25,
    "M16_NARROW": 0,
    # off until a GPU times the rule itself (gpu_pending.sh linear_walk): what motivates it are single launches of an
    # H100 sweep (the module docstring's M16_WALK_PCT); of the contract's cells M16's moves the 8B ones at M <= 16 only
    "M16_WALK_PCT": 0,
    "M64_WALK_PCT": 0,
    "M64_FILL_BLOCK_M": 64,
    "M64_FILL_BLOCK_N": 64,
    "M64_FILL_num_warps": 4,
    "M64_FILL_num_stages": 6,
    "M256_FILL_BLOCK_M": 128,
    "M256_FILL_BLOCK_N": 64,
    "M256_FILL_num_warps": 4,
    "M256_FILL_num_stages": 8,
    "M1024_BLOCK_M": 128,
    "M1024_BLOCK_N": 128,
    "M1024_num_warps": 8,
    "M1024_num_stages": 5,
    "M1024_K_UNROLL": 1,
    "M1024_SPLIT": 0,
    "MBIG_BLOCK_M": 128,
    "MBIG_BLOCK_N": 256,
    "MBIG_num_warps": 8,
    "MBIG_num_stages": 4,
    "MBIG_K_UNROLL": 1,
    "MBIG_SPLIT": 0,
    "PDL": 1,
    "PREFETCH": 0,
    # the tree's narrow-output rule (frozen, as KCHUNK; the module docstring)
    "NARROW_N": 2048,
    "NARROW_KCHUNK": 1024,
    # 1: a walking launch whose K fits one chunk carries no running total through its loop (the same bits). Off: on an
    # H100, Qwen3-8B's K = 4096 cells under a 4096 tree, the compute-bound 128 x 256 launches took 1.31-1.38x cuBLAS's
    # time with it and 1.02-1.08x without, in one call (linear_sweep_h100_k4096_one{1,0}_s44/); the other one-chunk
    # cells 0.5% faster with it (geomean; 2% faster to 7% slower a cell). ptxas serializes that 128 x 256 launch's
    # wgmmas with one chunk (linear_offline_s45.txt). Writing the accumulator's zeros again at the loop's first step
    # compiled without that warning, yet on an H100 every one-chunk launch of M >= 256 took 1.1-1.8x its time without
    # (linear_sweep_h100_{k4096,qwen3-0.6b}_one1_s45/), so it was not kept
    "ONE_CHUNK": 0,
    # 1: the bucket's launches compute each tile transposed (the module docstring's SWAP). Off: on an H100 the same bits
    # and no faster, the M16 bucket's best launch 0.994x cuBLAS swapped against 0.976x over Qwen3-8B's cells, 1.010x
    # against 1.033x over qwen3-0.6b's, its CONFIG tile slower swapped (linear_sweep_h100_*_swap{1,0}_s45/)
    "M16_SWAP": 0,
    "M64_SWAP": 0,
}

#: what the tuner checks a move against before spending an evaluation on it (the tuner's `fits`): each launch
#: tile's CONFIG keys (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, K_UNROLL); its operands' pipeline takes
#: num_stages x (BLOCK_M + BLOCK_N) x BLOCK_K x K_UNROLL bf16 elements of shared memory (Triton asked 262208 bytes for
#: 8 x (128 + 128) x 64 x 1 x 2 = 262144 on the H200), which must stay within SMEM_LIMIT (the H200's per-block maximum)
SMEM_TILES = {
    "M16": ("M16_BLOCK_M", "M16_BLOCK_N", "BLOCK_K", "M16_num_stages", "M16_K_UNROLL"),
    "M64": ("M64_BLOCK_M", "M64_BLOCK_N", "BLOCK_K", "M64_num_stages", "M64_K_UNROLL"),
    "M256": ("M256_BLOCK_M", "M256_BLOCK_N", "BLOCK_K", "M256_num_stages", "M256_K_UNROLL"),
    "M1024": ("M1024_BLOCK_M", "M1024_BLOCK_N", "BLOCK_K", "M1024_num_stages", "M1024_K_UNROLL"),
    "MBIG": ("MBIG_BLOCK_M", "MBIG_BLOCK_N", "BLOCK_K", "MBIG_num_stages", "MBIG_K_UNROLL"),
    "M64_FILL": ("M64_FILL_BLOCK_M", "M64_FILL_BLOCK_N", "BLOCK_K", "M64_FILL_num_stages", "M64_K_UNROLL"),
    "M256_FILL": ("M256_FILL_BLOCK_M", "M256_FILL_BLOCK_N", "BLOCK_K", "M256_FILL_num_stages", "M256_K_UNROLL"),
}
SMEM_LIMIT = 232448

#: (largest M, bucket) in increasing order; larger M uses "MBIG"
M_BUCKETS = ((16, "M16"), (64, "M64"), (256, "M256"), (1024, "M1024"))

#: programs that share a BLOCK_N column of the weight run next to each other (L2 reuse)
GROUP_M = 8

#: elements per program of the separate combine kernel
COMBINE_BLOCK = 1024


@triton.jit
def _sum_chunks(ws_ptr, o_m, o_n, m_ws, M, N, n_chunks):
    """((0 + ws[0]) + ws[1]) + ... + ws[n_chunks - 1] in fp32 at rows o_m (int64), columns o_n: the one merge order."""
    b_total = tl.zeros(m_ws.shape, dtype=tl.float32)
    for c in range(0, n_chunks):
        # .cg: chunk sums other programs wrote during this launch, never a stale L1 line
        b_part = tl.load(ws_ptr + (c * M + o_m) * N + o_n, mask=m_ws, other=0.0, cache_modifier=".cg")
        b_total = b_total + b_part
    return b_total


@triton.jit
def _prefetch_l2(ptrs):
    """Ask for the line at each address to be brought into L2 (PTX prefetch.global.L2): a hint, no value read."""
    tl.inline_asm_elementwise("mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit(do_not_specialize=["M", "CHUNKS_PER_PROG"])
def _linear_fwd_kernel(
    a_ptr,  # [M, K] rows to project (x, dy or dy.T), any strides
    b_ptr,  # [N, K] one row per output column (w, w.T or x.T), any strides
    c_ptr,  # [M, N] output
    a_desc,  # TMA: a's tiles (A_T: of a.T's storage); unused otherwise
    b_desc,  # TMA: b's tiles (B_T: of b.T's storage); unused otherwise
    ws_ptr,  # [n_chunks, M, N] fp32 chunk sums, contiguous (SPLIT only)
    cnt_ptr,  # [programs along axis 0] int32 arrivals, zero between launches (SPLIT and FUSED only)
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    CHUNKS_PER_PROG,  # consecutive K chunks one program computes (all of them unless SPLIT)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    KCHUNK: tl.constexpr,
    K_UNROLL: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT: tl.constexpr,
    FUSED: tl.constexpr,
    EVEN_K: tl.constexpr,
    UPCAST: tl.constexpr,
    TMA: tl.constexpr = False,  # operands through the tensor-memory accelerator: same values, same dots
    A_T: tl.constexpr = False,  # a's storage is [K, M] (a is a transposed view), so its tiles come transposed
    B_T: tl.constexpr = False,  # b's storage is [K, N]
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (ops/_common.py)
    PREFETCH: tl.constexpr = False,  # b's rows this program reads sent to L2 before the wait (b's unit stride is K)
    SILU: tl.constexpr = False,  # `linear_silu_mul`: b is [gate | up], 2N rows; c [M, N] gets silu(gate) * up (walking)
    ONE_CHUNK: tl.constexpr = False,  # walking, and K fits one chunk: no running total carried through the loop
    SWAP: tl.constexpr = False,  # the tile computed transposed, c.T = b @ a.T: the weight's rows are the MMA's rows
):
    pid = tl.program_id(0)
    pid_c = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    o_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    # rows/columns past the edge re-read a valid one (unmasked, pipelined loads); never stored
    o_am = o_m % M
    o_bn = o_n % N
    # SWAP: the accumulators are [BLOCK_N, BLOCK_M], so the output's (row, column) offsets are laid out transposed
    if SWAP:
        r_m = o_m[None, :]
        r_n = o_n[:, None]
    else:
        r_m = o_m[:, None]
        r_n = o_n[None, :]
    m_c = (r_m < M) & (r_n < N)
    ACC_R: tl.constexpr = BLOCK_N if SWAP else BLOCK_M  # the accumulators' shape
    ACC_C: tl.constexpr = BLOCK_M if SWAP else BLOCK_N

    n_chunks = tl.cdiv(K, KCHUNK)
    c_lo = pid_c * CHUNKS_PER_PROG
    c_hi = min(c_lo + CHUNKS_PER_PROG, n_chunks)
    k_lo = c_lo.to(tl.int64) * KCHUNK
    if PREFETCH:
        # before waiting for the kernel before this one: a decode step's weights are no kernel's output there, and
        # a prefetch moves lines into L2 (where every load reads them coherently), it returns no value
        for c_pf in range(c_lo, c_hi):
            o_line = tl.minimum(c_pf.to(tl.int64) * KCHUNK + tl.arange(0, KCHUNK // 64) * 64, K - 1)  # 128-B lines
            _prefetch_l2(b_ptr + o_bn[:, None] * stride_bn + o_line[None, :])
            if SILU:
                _prefetch_l2(b_ptr + (N + o_bn[:, None]) * stride_bn + o_line[None, :])
    pdl_start(PDL)  # nothing above reads or writes memory (the prefetch aside)
    o_k0 = k_lo + o_k
    p_a = a_ptr + o_am[:, None] * stride_am + o_k0[None, :] * stride_ak  # [BM, BK]
    p_b = b_ptr + o_bn[None, :] * stride_bn + o_k0[:, None] * stride_bk  # [BK, BN]
    # One flat loop over this program's steps (BLOCK_K * K_UNROLL of K each; KCHUNK is a multiple of a
    # step, so a chunk is STEPS whole steps, the last chunk fewer where K ends inside it). A chunk's sum
    # starts from a fresh accumulator and is handed on at its last step: added to the running total
    # (walking) or written to the workspace (split). Flat, not a loop per chunk, so the compiler pipelines
    # the loads across chunk boundaries and turns the reset into the MMA's "ignore the accumulator" flag.
    STEPS: tl.constexpr = KCHUNK // (BLOCK_K * K_UNROLL)
    n_steps = tl.cdiv(tl.minimum(c_hi.to(tl.int64) * KCHUNK, K) - k_lo, BLOCK_K * K_UNROLL)
    b_total = tl.zeros((ACC_R, ACC_C), dtype=tl.float32)
    b_acc = tl.zeros((ACC_R, ACC_C), dtype=tl.float32)
    # SILU: the up rows' sums beside the gate rows' (b's rows N + o_bn), the same steps into their own accumulators
    u_total = tl.zeros((ACC_R, ACC_C) if SILU else (1, 1), dtype=tl.float32)
    u_acc = tl.zeros((ACC_R, ACC_C) if SILU else (1, 1), dtype=tl.float32)
    for i in range(0, n_steps):
        k = k_lo + i * (BLOCK_K * K_UNROLL)
        for u in tl.static_range(K_UNROLL):
            if TMA:
                # out-of-bounds rows, columns and K are filled with +0: past K, exact zeros as below
                k_u = (k + u * BLOCK_K).to(tl.int32)
                if A_T:
                    b_a = a_desc.load([k_u, pid_m * BLOCK_M]).T
                else:
                    b_a = a_desc.load([pid_m * BLOCK_M, k_u])
                if B_T:
                    b_b = b_desc.load([k_u, pid_n * BLOCK_N])
                else:
                    b_b = b_desc.load([pid_n * BLOCK_N, k_u]).T
                if SILU:  # SILU is never B_T (the rollout's weight, rows along K)
                    b_u = b_desc.load([N + pid_n * BLOCK_N, k_u]).T
            elif EVEN_K:
                b_a = tl.load(p_a)
                b_b = tl.load(p_b)
                if SILU:
                    b_u = tl.load(p_b + N * stride_bn)
            else:
                # past K: exact zeros added to an accumulator that is never -0
                m_k = o_k < K - (k + u * BLOCK_K)
                b_a = tl.load(p_a, mask=m_k[None, :], other=0.0)
                b_b = tl.load(p_b, mask=m_k[:, None], other=0.0)
                if SILU:
                    b_u = tl.load(p_b + N * stride_bn, mask=m_k[:, None], other=0.0)
            if UPCAST:
                # the interpreter's bf16 tl.dot is wrong; fp32 operands are exact there
                b_a = b_a.to(tl.float32)
                b_b = b_b.to(tl.float32)
                if SILU:
                    b_u = b_u.to(tl.float32)
            if SWAP:
                # the same products summed over the same K slice, each output element's dot as before
                b_acc = tl.dot(b_b.T, b_a.T, b_acc)
                if SILU:
                    u_acc = tl.dot(b_u.T, b_a.T, u_acc)
            else:
                b_acc = tl.dot(b_a, b_b, b_acc)
                if SILU:
                    u_acc = tl.dot(b_a, b_u, u_acc)
            p_a += BLOCK_K * stride_ak
            p_b += BLOCK_K * stride_bk
        if not ONE_CHUNK:  # with one chunk, its sum is added to the total after the loop
            if (i % STEPS == STEPS - 1) | (i == n_steps - 1):
                if SPLIT:
                    c = c_lo + i // STEPS
                    p_ws = ws_ptr + (c * M + r_m) * N + r_n
                    tl.store(p_ws, b_acc, mask=m_c)
                else:
                    # the merge order of `_sum_chunks`: chunk c is added to the sum of chunks 0 .. c-1
                    b_total = b_total + b_acc
                    if SILU:
                        u_total = u_total + u_acc
                b_acc = tl.zeros((ACC_R, ACC_C), dtype=tl.float32)
                if SILU:
                    u_acc = tl.zeros((ACC_R, ACC_C), dtype=tl.float32)
    if ONE_CHUNK:
        # the tree's ((0 + s_0)) as the walk computes it: the total's registers were never held beside the chunk's
        # (a 128 x 256 tile's two would fill an SM's register file)
        b_total = b_total + b_acc
        if SILU:
            u_total = u_total + u_acc
    p_c = c_ptr + r_m * stride_cm + r_n * stride_cn
    if SPLIT:
        if FUSED:
            # every thread's chunk sums are written before one thread announces them (release at GPU scope)
            tl.debug_barrier()
            arrived = tl.atomic_add(cnt_ptr + pid, 1)
            if arrived == tl.num_programs(1) - 1:
                b_total = _sum_chunks(ws_ptr, r_m, r_n, m_c, M, N, n_chunks)
                tl.store(p_c, b_total.to(c_ptr.dtype.element_ty), mask=m_c)
                tl.atomic_xchg(cnt_ptr + pid, 0)
    elif SILU:
        # gate and up columns rounded as linear stores them, then silu_mul's formula: silu_mul's kernel reads those
        # rounded values back and computes the same
        b_gate = b_total.to(c_ptr.dtype.element_ty).to(tl.float32)
        b_up = u_total.to(c_ptr.dtype.element_ty).to(tl.float32)
        tl.store(p_c, round_to(silu_mul_math(b_gate, b_up), c_ptr.dtype.element_ty), mask=m_c)
    else:
        tl.store(p_c, b_total.to(c_ptr.dtype.element_ty), mask=m_c)


@triton.jit(do_not_specialize=["M", "n_chunks"])
def _linear_combine_kernel(
    ws_ptr,  # [n_chunks, M, N] fp32 chunk sums, contiguous
    c_ptr,  # [M, N] output
    M,
    N,
    n_chunks,
    stride_cm,
    stride_cn,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    o_m, o_n = o // N, o % N
    m_o = o_m < M
    b_total = _sum_chunks(ws_ptr, o_m, o_n, m_o, M, N, n_chunks)
    tl.store(c_ptr + o_m * stride_cm + o_n * stride_cn, b_total.to(c_ptr.dtype.element_ty), mask=m_o)


def _bucket(M: int) -> str:
    for limit, name in M_BUCKETS:
        if M <= limit:
            return name
    return "MBIG"


def _tile(M: int, N: int | None = None, sms: int = DEFAULT_SMS,
          K: int | None = None) -> tuple[int, int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, K_UNROLL, SPLIT) for M rows: any may follow M, none changes bits.

    WIDE_WAVES > 0: an M256 / M1024 launch whose output is wide enough that the MBIG tile alone gives at
    least WIDE_WAVES waves of programs (lm_head, gate_up) takes the MBIG tile instead of its bucket's.
    FILL_PCT, then NARROW_PCT (an M16 launch only with M16_NARROW), then the bucket's WALK_PCT (with K): see the
    module's docstring.
    """
    b = _launch_bucket(M, N, sms)
    tile = tuple(CONFIG[f"{b}_{k}"] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "K_UNROLL", "SPLIT"))
    fill = CONFIG["FILL_PCT"]
    if fill and N is not None and f"{b}_FILL_BLOCK_M" in CONFIG and not _fills(M, N, *tile[:2], fill, sms):
        tile = tuple(CONFIG[f"{b}_FILL_{k}"] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")) + tile[4:]
    narrow = CONFIG.get("NARROW_PCT", 0)
    if b == "M16" and not CONFIG.get("M16_NARROW", 0):
        narrow = 0
    if narrow and N is not None:
        tile = (tile[0], _narrowed(M, N, *tile[:2], narrow, sms, 16)) + tile[2:]
    walk = CONFIG.get(f"{b}_WALK_PCT", 0)
    if walk and tile[5] and N is not None and K is not None and K > _kchunk(N):
        block_n = _narrowed(M, N, *tile[:2], walk, sms, 32)
        if block_n >= 32 and _fills(M, N, tile[0], block_n, walk, sms):
            tile = (tile[0], block_n) + tile[2:5] + (0,)
    return tile


def _fills(M: int, N: int, block_m: int, block_n: int, pct: int, sms: int) -> bool:
    """Whether an M x N output in block_m x block_n tiles gives at least pct % of the SMs tiles."""
    return triton.cdiv(M, block_m) * triton.cdiv(N, block_n) * 100 >= pct * sms


def _narrowed(M: int, N: int, block_m: int, block_n: int, pct: int, sms: int, floor: int) -> int:
    """block_n halved, not below floor, while the tiles are fewer than pct % of the SMs (NARROW_PCT, WALK_PCT)."""
    while block_n > floor and not _fills(M, N, block_m, block_n, pct, sms):
        block_n //= 2
    return block_n


def _launch_bucket(M: int, N: int | None = None, sms: int = DEFAULT_SMS) -> str:
    """The bucket whose launch serves M rows of an N-wide output (its M bucket, or MBIG where WIDE_WAVES or
    FULL_WAVE_PCT moves it)."""
    b = _bucket(M)
    if N is not None and b in ("M256", "M1024"):
        wide = tuple(CONFIG[f"MBIG_{k}"] for k in ("BLOCK_M", "BLOCK_N"))
        n = triton.cdiv(M, wide[0]) * triton.cdiv(N, wide[1])  # the MBIG tile's programs
        waves, full = CONFIG["WIDE_WAVES"], CONFIG.get("FULL_WAVE_PCT", 0)
        if (waves and n >= waves * sms) or (full and full * sms <= 100 * n <= 100 * sms):
            b = "MBIG"
    return b


_COUNTERS: dict = {}
_DUMMIES: dict = {}


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """n zeroed int32 arrival counters on `device`, kept between calls (each launch leaves them zero)."""
    cnt = _COUNTERS.get(device)
    if cnt is None or cnt.numel() < n:
        cnt = _COUNTERS[device] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return cnt


def _dummy(device: torch.device) -> torch.Tensor:
    """An fp32 workspace argument for launches that never touch it."""
    if device not in _DUMMIES:
        _DUMMIES[device] = torch.zeros(1, dtype=torch.float32, device=device)
    return _DUMMIES[device]


def _tma_operand(t: torch.Tensor, block_rows: int, block_k: int):
    """(descriptor, transposed) for an operand t[R, K] read in [block_rows, block_k] tiles, or None.

    TMA needs a unit stride in one dimension and 16-byte aligned rows and base; a transposed view (unit
    stride along R, as dy.T and x.T in the backward) is described through its storage, tiles [block_k,
    block_rows], which the kernel transposes back. Anything else goes through pointers: the same values.
    """
    if TensorDescriptor is None or t.data_ptr() % 16:
        return None
    size = t.element_size()
    if t.stride(1) == 1 and (t.stride(0) * size) % 16 == 0:
        return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], [block_rows, block_k]), False
    if t.stride(0) == 1 and (t.stride(1) * size) % 16 == 0:
        s = t.t()
        return TensorDescriptor(s, list(s.shape), [s.stride(0), 1], [block_k, block_rows]), True
    return None


def _kchunk(N: int) -> int:
    """The chunk size of a product with N output columns, N the weight's side (its rows in the forward, its
    columns for dx, the input's width for dw), never the token count: NARROW_KCHUNK for an output of at most
    NARROW_N columns, KCHUNK otherwise."""
    if N <= CONFIG.get("NARROW_N", 0):
        return CONFIG["NARROW_KCHUNK"]
    return CONFIG["KCHUNK"]


def _chunks_per_program(tiles: int, n_chunks: int, split: int, sms: int) -> int:
    """Fewest consecutive chunks per program that give `tiles` × groups ≥ split × sms programs; all if split = 0."""
    if split == 0 or n_chunks == 1:
        return n_chunks
    groups = min(n_chunks, triton.cdiv(split * sms, tiles))
    return triton.cdiv(n_chunks, max(groups, 1))


def _matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    tile: tuple | None = None,
    block_k: int | None = None,
    chunks_per_prog: int | None = None,
    fused: bool | None = None,
    tma: bool | None = None,
    silu: bool = False,
    swap: bool | None = None,
) -> torch.Tensor | None:
    """a[M, K] @ b[N, K].T -> [M, N] in `out_dtype` (default a's), any strides.

    `tile`, `chunks_per_prog`, `fused`, `tma` and `swap` override CONFIG's launch (the CPU tests and
    benchmarks/sweep_linear_tree.py use them; none changes bits); `block_k` overrides the frozen
    BLOCK_K (tests only: it does change bits). The entry point passes none of them.
    `silu`: b is a gate_up weight [gate | up] of 2F rows and the result is silu(gate) * up, [M, F]
    (`linear_silu_mul`); None where the launch would split K (the epilogue is the walking program's).
    """
    M, K = a.shape
    N, K2 = b.shape
    if K != K2:
        raise ValueError(f"linear: inner dims differ: {tuple(a.shape)} @ {tuple(b.shape)}.T")
    if silu and (N % 2 or M == 0 or K == 0):
        return None
    shape, dtype = (M, N // 2 if silu else N), out_dtype or a.dtype
    if M == 0 or N == 0:
        return torch.empty(shape, device=a.device, dtype=dtype)
    if K == 0:
        return torch.zeros(shape, device=a.device, dtype=dtype)
    sms = sm_count(a.device)
    BLOCK_M, BLOCK_N, num_warps, num_stages, K_UNROLL, SPLIT = tile or _tile(M, N, sms, K)
    if swap is None:  # the bucket of the launch `_tile` chose, from the same N
        swap = CONFIG.get(f"{_launch_bucket(M, N, sms)}_SWAP", 0)
    if swap:
        # one dot an iteration: with two, Triton 3.6 waits for each swapped wgmma before the next (8 waits a loop
        # against 2, benchmarks/linear_offline.py), so the tuner's one move to SWAP is not the slow form
        K_UNROLL = 1
    BLOCK_K = block_k or CONFIG["BLOCK_K"]
    KCHUNK = _kchunk(N)  # the product's tree: N is all 2F rows with silu too
    if KCHUNK % (BLOCK_K * K_UNROLL):
        raise ValueError(f"linear: KCHUNK {KCHUNK} is no multiple of BLOCK_K {BLOCK_K} x K_UNROLL {K_UNROLL}")
    if silu:
        # a program takes BLOCK_N / 2 gate rows and the up rows of the same columns: the plain launch's weight rows
        # a program, its number of programs, over an output of F columns
        N, BLOCK_N = N // 2, max(16, BLOCK_N // 2)
    n_chunks = triton.cdiv(K, KCHUNK)
    tiles = triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N)
    per_prog = chunks_per_prog or _chunks_per_program(tiles, n_chunks, SPLIT, sms)
    groups = triton.cdiv(n_chunks, per_prog)
    split = groups > 1
    if silu and split:  # the epilogue is the walking program's
        return None
    c = torch.empty(shape, device=a.device, dtype=dtype)
    fuse = split and (CONFIG["FUSED_COMBINE"] and M <= CONFIG["FUSED_MAX_M"] if fused is None else fused)
    # only a split launch touches the workspace and the counters
    ws = torch.empty((n_chunks, M, N), device=a.device, dtype=torch.float32) if split else _dummy(a.device)
    cnt = _counters(a.device, tiles if fuse else 1)
    da = db = None
    if CONFIG["TMA"] if tma is None else tma:
        da, db = _tma_operand(a, BLOCK_M, BLOCK_K), _tma_operand(b, BLOCK_N, BLOCK_K)
    use_tma = da is not None and db is not None and not (silu and db[1])  # silu reads b's rows along K
    pdl = pdl_launch(CONFIG.get("PDL"), a.device)
    # the weight's lines into L2 first (on the GPU, where b's rows run along K: the forward's w)
    prefetch = bool(CONFIG.get("PREFETCH")) and not INTERPRET and b.stride(1) == 1
    _linear_fwd_kernel[(tiles, groups)](
        a, b, c, da[0] if use_tma else a, db[0] if use_tma else b, ws, cnt, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1), per_prog,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, KCHUNK=KCHUNK, K_UNROLL=K_UNROLL, GROUP_M=GROUP_M,
        SPLIT=split, FUSED=bool(fuse), EVEN_K=K % (BLOCK_K * K_UNROLL) == 0, UPCAST=INTERPRET,
        TMA=use_tma, A_T=use_tma and da[1], B_T=use_tma and db[1],
        PREFETCH=prefetch, SILU=silu, ONE_CHUNK=bool(CONFIG.get("ONE_CHUNK")) and n_chunks == 1, SWAP=bool(swap),
        num_warps=num_warps, num_stages=num_stages, **pdl,
    )  # fmt: skip
    if split and not fuse:
        _linear_combine_kernel[(triton.cdiv(M * N, COMBINE_BLOCK),)](
            ws, c, M, N, n_chunks, c.stride(0), c.stride(1), BLOCK=COMBINE_BLOCK, num_warps=4, **pdl,
        )  # fmt: skip
    return c


class LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return _matmul(x, w)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w = ctx.saved_tensors
        dx = dw = None
        if ctx.needs_input_grad[0]:
            # dx[T, K] = dy[T, N] @ w[N, K]: reduce over N in the fixed tree, rows batch-invariant
            dx = _matmul(dy, w.t())
        if ctx.needs_input_grad[1]:
            # dw[N, K] = dy.T[N, T] @ x[T, K]: reduce over the tokens in the fixed tree, deterministic
            dw = _matmul(dy.t(), x.t(), out_dtype=w.dtype)
        return dx, dw


def linear_silu_mul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
    """silu_mul(linear(x, w)) bit for bit, in one launch, for a gate_up weight w = [gate | up] (2F rows): no
    gradient (the rollout's MLP), or None where it does not apply (the launch would split K, as a small batch's over a
    K of more than one chunk does; an odd number of weight rows): then the caller makes the two calls.

    Why the bits are the two calls': each program walks the K steps of its gate columns j and of their up columns
    F + j into two accumulators, each column summed as linear sums it (the tree is KCHUNK's for all 2F rows, and a
    column's sum never depends on the tile it falls in or its neighbours); both are rounded to x's dtype as linear
    stores them, then go through silu_mul's formula (`silu_mul.silu_mul_math`) and its rounding. Saves the [T, 2F]
    product's round trip through memory and silu_mul's launch: a decode step's 28 (qwen3) of ~250. A program holds
    BLOCK_N / 2 gate and BLOCK_N / 2 up columns, the plain launch's weight rows and registers a program."""
    if w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear_silu_mul: x {tuple(x.shape)} and w {tuple(w.shape)} do not match")
    x2 = x.reshape(-1, x.shape[-1])
    y = _matmul(x2, w, silu=True)
    return None if y is None else y.view(*x.shape[:-1], w.shape[0] // 2)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x[..., K] @ w[N, K].T -> [..., N]; a row's bits never depend on the other rows."""
    if w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: x {tuple(x.shape)} and w {tuple(w.shape)} do not match (w is [N, K])")
    x2 = x.reshape(-1, x.shape[-1])
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        y = LinearFunction.apply(x2, w)
    else:
        y = _matmul(x2, w)
    return y.reshape(*x.shape[:-1], w.shape[0])
