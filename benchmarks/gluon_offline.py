"""What ptxas makes of the Gluon kernels (the root's forward, tik_kernels/ops/attention_gluon.py, and the experiments in
tik_kernels/experimental/) for sm_90, without a GPU.

    PYTHONPATH=<a pip --target dir of triton==3.6.0>:. python benchmarks/gluon_offline.py

The attention forward for GQA groups 1, 4 and 7 (and packed sequences at 4 and 7), with the next block's loads sent
early (PREFETCH) and without: registers and spill bytes a thread, shared memory (two programs an SM need at most 113 KB
each; 128 rows of 8 warps take the registers of a whole SM), and the SASS loops with their spill instructions and wgmmas
(`attn_ir_offline.inner_loops`: the first is the TMA loop every whole block runs, the second the pointer-loaded block
crossing the sequence's end). Gluon is compiled by the Triton on the path; the GPU machine runs 3.6, whose Gluon these
kernels are written for. Then the small-batch linear (gluon_linear_small.py) with rings of 8 and 4 weight tiles.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import offline_compile as oc  # noqa: E402 (first: it turns the interpreter off before Triton is imported)
import triton  # noqa: E402
from attn_ir_offline import inner_loops  # noqa: E402


def _desc(shape: list[int]) -> str:
    """The signature type of a TMA descriptor over bf16 tiles of `shape`, in the layout the host code gives it."""
    from triton.experimental.gluon import language as gl

    layout = gl.NVMMASharedLayout.get_default_for(shape, gl.bfloat16)
    return f"tensordesc<bf16[{shape[0]}, {shape[1]}],{layout!r}>"


def _compile(fn, const: dict, types: dict, aligned, warps: int, **options):
    """`fn` as a launch specializes it (`offline_compile.compile_sm90`: pointers aligned, the integers in `aligned`
    divisible by 16, the other arguments bf16 pointers or i32 by name), one stage, fp fusion off."""
    return oc.compile_sm90(fn, const, types, dict(num_warps=warps, num_stages=1, enable_fp_fusion=False, **options),
                           aligned=aligned)


def _attention(fn, const: dict, warps: int):
    """An attention forward at bench_speed's shapes: strides and lengths divisible by 16, lse's along the sequence 1
    (a launch makes an integer argument of 1 a constexpr)."""
    from tik_kernels.ops import attention_gluon as g

    const = {**const, "stride_ls": 1}
    kv = _desc([g.BLOCK_N, g.HEAD_DIM])
    types = {"lse_ptr": "*fp32", "cu_ptr": "*i32", "qk_scale": "fp32", "k_desc": kv, "v_desc": kv}
    aligned = [n for n in oc.signature(fn, const, types)[1] if n.startswith("stride_") or n in ("L", "seq_len")]
    return _compile(fn, const, types, aligned, warps)


def compile_case(G: int, prefetch: bool, block_m: int = 64, varlen: bool = False):
    from tik_kernels.ops import attention_gluon as g

    const = dict(G=G, D=g.HEAD_DIM, BLOCK_M=block_m, BLOCK_N=g.BLOCK_N, CHUNK=g.CHUNK_BLOCKS, L_COLS=g.L_COLS,
                 PREFETCH=prefetch, VARLEN=varlen)
    return _attention(g._attn_fwd_gluon_kernel, const, block_m // 16)


def compile_ws(G: int):
    """The warp-specialized forward (gluon_attn_fwd_ws.py) at GQA G, launched as it is (168 registers a thread at
    launch: 12 warps' share of the register file, which the partitions then take as 240 / 240 / 24)."""
    from tik_kernels.experimental import gluon_attn_fwd_ws as ws
    from tik_kernels.ops import attention_gluon as g

    const = dict(G=G, D=g.HEAD_DIM, BLOCK_M=g.BLOCK_M, BLOCK_N=g.BLOCK_N, CHUNK=g.CHUNK_BLOCKS, L_COLS=g.L_COLS)
    return _attention(ws._attn_fwd_ws_kernel, const, 4)


def compile_linear(stages: int, swap: bool = True, kchunk: int = 2048):
    from tik_kernels.experimental import gluon_linear_small as g

    const = dict(KCHUNK=kchunk, BLOCK_N=g.BLOCK_N, BLOCK_K=g.BLOCK_K, STAGES=stages, SWAP=swap, PDL=True)
    types = {"ws_ptr": "*fp32", "cnt_ptr": "*i32", "w_desc": _desc([g.BLOCK_N, g.BLOCK_K]),
             "x_desc": _desc([g.M_PAD if swap else g.X_ROWS_UNSWAPPED, g.BLOCK_K])}
    return _compile(g._linear_small_kernel, const, types, ("N", "K", "stride_cm"), 4, launch_pdl=True)


def assembled(k) -> tuple[str, str]:
    """(ptxas's report, the SASS) of a compiled kernel, assembled with Triton's ptxas and disassembled."""
    with tempfile.TemporaryDirectory() as d:
        out = oc.assemble(k.asm["ptx"], Path(d) / "k.cubin")
        return out, oc.disassemble(Path(d) / "k.cubin") or ""


def describe(k, asm: tuple[str, str] | None = None) -> tuple[str, str]:
    """(ptxas's registers, spills and shared memory; the SASS innermost loops) of a compiled kernel (`asm`: its
    `assembled` output where the caller has it already)."""
    out, sass = asm or assembled(k)
    regs = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    loops = "; ".join(f"{n} instructions (spill stores {st}, loads {ld}, wgmma {mma})"
                      for n, st, ld, mma in inner_loops(sass))
    return (f"registers {regs.group(1) if regs else '?'}, spill stores/loads "
            f"{'/'.join(spills.groups()) if spills else '?'} B, shared {k.metadata.shared} B"
            f"{', WGMMA SERIALIZED (ptxas C7515)' if 'C7515' in out else ''}", loops)


def main() -> None:
    print(f"triton {triton.__version__}, {oc.ptxas_version()}")
    cases = [(G, prefetch, 64) for G in (1, 4, 7) for prefetch in (True, False)] + [(4, True, 128), (4, False, 128)]
    for G, prefetch, block_m in cases:
        head, loops = describe(compile_case(G, prefetch, block_m))
        print(f"attention forward, G {G}, {block_m} rows, {'prefetch' if prefetch else 'own step'}: {head}\n"
              f"    innermost loops: {loops}")
    for G in (4, 7):
        head, loops = describe(compile_case(G, True, 64, varlen=True))
        print(f"attention forward, packed (varlen), G {G}, 64 rows, prefetch: {head}\n    innermost loops: {loops}")
    for G in (1, 4):
        head, loops = describe(compile_ws(G))
        print(f"attention forward, warp-specialized, G {G}: {head}\n    innermost loops: {loops}")
    for stages, swap in ((8, True), (4, True), (6, False)):
        head, loops = describe(compile_linear(stages, swap))
        print(f"linear, {'M <= 16, swapped' if swap else 'M <= 64, x padded to 64 rows'}, a ring of {stages}: {head}\n"
              f"    innermost loops: {loops}")

if __name__ == "__main__":
    main()
