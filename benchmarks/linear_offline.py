"""The linear root's walking launches compiled for sm_90 without a GPU: registers, spills and the SASS loop, with the
running total carried through the loop (K of several chunks) and without it (ONE_CHUNK: K within one chunk), and for
the buckets with a SWAP key (M16, M64 and its FILL tile) the tile computed transposed (SWAP: wgmma in the loop?), also
with K_UNROLL 1 where the bucket's is more: Triton 3.6 waits for each swapped wgmma before the next when a loop
iteration holds two dots (8 waits a loop, against one wgmma group in flight with one dot).

    PYTHONPATH=<a pip --target dir of triton==3.6.0>:. python benchmarks/linear_offline.py [--out FILE]

Each CONFIG bucket's tile (BLOCK_M, BLOCK_N, num_warps, num_stages, K_UNROLL; its FILL tile where it has one) as the
walking program (SPLIT 0, TMA operands, PDL), compiled as a forward launch specializes it
(`offline_compile.compile_sm90`: the unit strides constexpr 1, the others and N and K divisible by 16). Both forms
compute the same tree; what differs is whether a second accumulator's registers are held through the loop. A spill
inside the loop is paid every K step, one outside it once a program.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import offline_compile as oc  # noqa: E402 (first: it turns the interpreter off before Triton is imported)
import triton  # noqa: E402
from attn_ir_offline import innermost  # noqa: E402
from gluon_offline import assembled, describe  # noqa: E402


def tiles(cfg: dict) -> list[tuple[str, tuple]]:
    """(bucket, (BLOCK_M, BLOCK_N, num_warps, num_stages, K_UNROLL)) of each CONFIG launch tile, FILL tiles included:
    the tiles `linear.SMEM_TILES` names (with the key each reads its K_UNROLL from), and each one's warps."""
    from tik_kernels.ops import linear as L

    return [(b, (cfg[bm], cfg[bn], cfg[f"{b}_num_warps"], cfg[stages], cfg[unroll]))
            for b, (bm, bn, _, stages, unroll) in L.SMEM_TILES.items()]


def can_swap(bucket: str) -> bool:
    """Whether the bucket's launches can compute their tile transposed (a `<M bucket>_SWAP` key in the root's
    TUNABLES)."""
    from tik_kernels.ops import linear as L

    return f"{bucket.split('_')[0]}_SWAP" in L.TUNABLES


def wgmma_waits(sass: str) -> list[int]:
    """The `WARPGROUP.DEPBAR` instructions (waits for wgmma groups in flight) in each innermost loop of a kernel's
    SASS: one or two where the MMAs are pipelined (one group left in flight, all at a chunk's end), one per wgmma
    where each is waited for before the next."""
    return [sum("WARPGROUP.DEPBAR" in t for t in loop) for loop in innermost(sass)]


def forms(bucket: str, tile: tuple) -> list[tuple[bool, bool, tuple]]:
    """(ONE_CHUNK, SWAP, tile) to compile for a bucket's tile: the running total, ONE_CHUNK, where the bucket can
    swap, the swapped running total with the tile's K_UNROLL and with K_UNROLL 1, and for a wgmma tile (64 rows or
    more) of K_UNROLL 1 the running total with K_UNROLL 2 (a tuner's move: are its wgmmas still pipelined?), its stages
    cut to what fits `linear.SMEM_LIMIT`."""
    from tik_kernels.ops import linear as L

    out = [(False, False, tile), (True, False, tile)]
    if tile[0] >= 64 and tile[4] == 1:
        bm, bn, warps, stages, _ = tile
        per_stage = (bm + bn) * L.CONFIG["BLOCK_K"] * 2 * 2  # two BLOCK_K slices of both operands, bf16
        out.append((False, False, (bm, bn, warps, max(2, min(stages, L.SMEM_LIMIT // per_stage)), 2)))
    if can_swap(bucket):
        out += [(False, True, t) for t in dict.fromkeys([tile, tile[:4] + (1,)])]
    return out


def compile_walk(tile: tuple, one_chunk: bool, swap: bool = False):
    from tik_kernels.ops import linear as L

    bm, bn, warps, stages, unroll = tile
    fn, bk = L._linear_fwd_kernel, L.CONFIG["BLOCK_K"]
    # the forward's unit strides (x's and w's along K, the output's along N) are constexpr 1 in a real launch, as
    # Triton specializes an integer argument of 1: without them the store is scalar and the registers are others
    const = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, KCHUNK=L.CONFIG["KCHUNK"], K_UNROLL=unroll, GROUP_M=L.GROUP_M,
                 SPLIT=False, FUSED=False, EVEN_K=True, UPCAST=False, TMA=True, PDL=True, ONE_CHUNK=one_chunk,
                 SWAP=swap, stride_ak=1, stride_bk=1, stride_cn=1)
    types = {"ws_ptr": "*fp32", "cnt_ptr": "*i32", "a_desc": f"tensordesc<bf16[{bm},{bk}]>",
             "b_desc": f"tensordesc<bf16[{bn},{bk}]>"}
    aligned = [n for n in oc.signature(fn, const, types)[1] if n.startswith("stride_") or n in ("N", "K")]
    return oc.compile_sm90(fn, const, types, dict(num_warps=warps, num_stages=stages, launch_pdl=True),
                           aligned=aligned)


def main() -> int:
    from tik_kernels.ops import linear as L

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="also write the lines to this file")
    args = ap.parse_args()
    lines = [f"triton {triton.__version__}, {oc.ptxas_version()}; linear's walking launches, TMA, PDL",
             "bucket (BLOCK_M, BLOCK_N, warps, stages, K_UNROLL): running total | ONE_CHUNK | running total, SWAP; "
             "wgmma waits a loop where the tile's MMA is wgmma"]
    print("\n".join(lines), flush=True)
    for bucket, tile in tiles(L.CONFIG):
        for one, swap, t in forms(bucket, tile):
            k = compile_walk(t, one, swap)
            asm = assembled(k)  # once: the summary and the waits read the same SASS
            summary, loops = describe(k, asm)
            form = "ONE_CHUNK    " if one else "running total" + (", SWAP" if swap else "")
            waits = f"; wgmma waits a loop: {', '.join(map(str, wgmma_waits(asm[1])))}" if swap or t[0] >= 64 else ""
            line = f"{bucket:10s} {t} {form}: {summary}; loop: {loops}{waits}"
            lines.append(line)
            print(line, flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
