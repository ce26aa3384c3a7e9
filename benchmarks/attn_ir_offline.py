"""What the compiler makes of the attention root's backward and forward kernels for an H200, without a GPU.

    PYTHONPATH=. python benchmarks/attn_ir_offline.py > benchmarks/results/attn_ir_sm90_offline.txt
    PYTHONPATH=. python benchmarks/attn_ir_offline.py --head-dim 256    # the launches at D = 256 fit an H200?

Each kernel is compiled by this machine's Triton for sm_90 (GQA 4, head dim 128, bf16, fp fusion off) as a launch
specializes it (`offline_compile.py`), its PTX assembled by the ptxas Triton runs for sm_90 (`-v`), and reported:
registers and spill bytes per thread, shared memory, wgmma ops and their waits (with how many stay pending),
asynchronous copies and TMA loads. The device runs Triton 3.6: put that version first on the path
(`PYTHONPATH=<a pip --target dir of triton==3.6.0>:.`) for its figures; `kernel_ir.py` reports real launches there.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import offline_compile as oc  # noqa: E402 (first: it turns the interpreter off before Triton is imported)
import triton  # noqa: E402

from tik_kernels.contract import load_module  # noqa: E402

SOURCE = Path(__file__).resolve().parents[1] / "tik_kernels" / "ops" / "attention.py"
POINTERS = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", do_ptr="*bf16", dq_ptr="*bf16", dk_ptr="*bf16",
                dv_ptr="*bf16", o_ptr="*bf16", lse_ptr="*fp32", delta_ptr="*fp32", cu_ptr="*i32", ws_ptr="*fp32",
                cnt_ptr="*i32", ds_ptr="*bf16", ds_base_ptr="*i64", ds_tile_ptr="*i64", t_ptr="*fp32", k_desc="*bf16",
                v_desc="*bf16", qk_scale="fp32", sm_scale="fp32", lens_ptr="*i32", wm_ptr="*fp32", wl_ptr="*fp32",
                wa_ptr="*fp32", scratch_ptr="*fp32")
#: (name, kernel, constexprs, warps, stages, TMA tile or None)
CASES = (
    ("dq 128 rows, 64-key steps", "_attn_bwd_dq_kernel", dict(BLOCK_M=128, BLOCK_N=64, SUB=64, TMA=False), 8, 2),
    ("dq 128 rows, 64-key steps, TMA", "_attn_bwd_dq_kernel", dict(BLOCK_M=128, BLOCK_N=64, SUB=64, TMA=True), 8, 2),
    ("dq 128 rows, 128-key steps", "_attn_bwd_dq_kernel", dict(BLOCK_M=128, BLOCK_N=128, SUB=64, TMA=False), 8, 2),
    ("dq 64 rows, 64-key steps", "_attn_bwd_dq_kernel", dict(BLOCK_M=64, BLOCK_N=64, SUB=64, TMA=False), 8, 2),
    ("dq 64 rows, 64-key steps, 4 warps", "_attn_bwd_dq_kernel", dict(BLOCK_M=64, BLOCK_N=64, SUB=64, TMA=False),
     4, 2),
    ("dk/dv 64 keys", "_attn_bwd_dkdv_kernel", dict(BLOCK_M=64, BLOCK_N=64, FUSED=False, SUB=64), 8, 2),
    ("dk/dv 128 keys", "_attn_bwd_dkdv_kernel", dict(BLOCK_M=64, BLOCK_N=128, FUSED=False, SUB=64), 8, 2),
    ("dk/dv 64 keys, dS stored", "_attn_bwd_dkdv_kernel", dict(BLOCK_M=64, BLOCK_N=64, FUSED=False, SUB=64,
                                                                 DS_STORE=True), 8, 2),
    ("dk/dv 128 keys, dS stored", "_attn_bwd_dkdv_kernel", dict(BLOCK_M=64, BLOCK_N=128, FUSED=False, SUB=64,
                                                                  DS_STORE=True), 8, 2),
    ("dq from stored dS, 128 rows", "_attn_bwd_dq_ds_kernel", dict(BLOCK_M=128, TM=64, SUB=64), 8, 2),
    ("dq from stored dS, 128 rows, 3 stages", "_attn_bwd_dq_ds_kernel", dict(BLOCK_M=128, TM=64, SUB=64), 8, 3),
    ("dq from stored dS, 64 rows, 4 warps", "_attn_bwd_dq_ds_kernel", dict(BLOCK_M=64, TM=64, SUB=64), 4, 3),
    ("forward 128 x 128", "_attn_fwd_kernel", dict(BLOCK_M=128, BLOCK_N=128, CHUNK=4, TOTAL_IN_MEMORY=False,
                                                   TMA=False), 8, 2),
    ("forward 128 x 128, TMA", "_attn_fwd_kernel", dict(BLOCK_M=128, BLOCK_N=128, CHUNK=4, TOTAL_IN_MEMORY=False,
                                                        TMA=True), 8, 2),
    ("forward 128 x 128, TMA, one loop", "_attn_fwd_kernel", dict(BLOCK_M=128, BLOCK_N=128, CHUNK=4,
                                                                  TOTAL_IN_MEMORY=False, TMA=True, ONE_LOOP=True),
     8, 2),
    # the CONFIG's since session 28
    ("forward 64 x 128, TMA, one loop", "_attn_fwd_kernel", dict(BLOCK_M=64, BLOCK_N=128, CHUNK=4,
                                                                 TOTAL_IN_MEMORY=False, TMA=True, ONE_LOOP=True),
     4, 1),
    ("forward 64 x 128, TMA", "_attn_fwd_kernel", dict(BLOCK_M=64, BLOCK_N=128, CHUNK=4, TOTAL_IN_MEMORY=False,
                                                       TMA=True), 4, 1),
    ("forward 64 x 128, TMA, one loop, total in memory", "_attn_fwd_kernel",
     dict(BLOCK_M=64, BLOCK_N=128, CHUNK=4, TOTAL_IN_MEMORY=True, TMA=True, ONE_LOOP=True), 4, 1),
    ("forward 64 x 128, TMA, one loop, 8 warps", "_attn_fwd_kernel",
     dict(BLOCK_M=64, BLOCK_N=128, CHUNK=4, TOTAL_IN_MEMORY=False, TMA=True, ONE_LOOP=True), 8, 1),
)


#: an H200's shared memory per block (bytes)
SHARED_LIMIT = 232448


def launch_cases(mod, d: int) -> list[tuple]:
    """The launches the host code makes at head dim d (`_for_head_dim` of the CONFIG), as CASES rows."""
    c = mod._for_head_dim(dict(mod.CONFIG), d)
    sub = c["DQ_BLOCK_N"]
    return [
        (f"forward, D {d}", "_attn_fwd_kernel", dict(D=d, BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"],
                                                     CHUNK=c["CHUNK_BLOCKS"], TOTAL_IN_MEMORY=False, TMA=False),
         c["num_warps"], c["num_stages"]),
        *((f"decode{' folded' if fold else ''}, D {d}", "_attn_decode_kernel",
           dict(D=d, BLOCK_M=c["DECODE_BLOCK_M"], BLOCK_N=c["BLOCK_N"], CHUNK=c["CHUNK_BLOCKS"],
                CHUNKS_PER_PROG=c["DECODE_CHUNKS_PER_PROG"], FOLD=fold), c["decode_num_warps"], c["decode_num_stages"])
          for fold in (False, True)),
        (f"dq kernel, D {d}", "_attn_bwd_dq_kernel", dict(D=d, BLOCK_M=c["DQ_BLOCK_M"], BLOCK_N=c["DQ_TILE_N"], SUB=sub,
                                                          TMA=False), c["dq_num_warps"], c["dq_num_stages"]),
        (f"dk/dv, D {d}", "_attn_bwd_dkdv_kernel", dict(D=d, BLOCK_M=c["DKDV_BLOCK_M"], BLOCK_N=c["DKDV_BLOCK_N"],
                                                        FUSED=False, SUB=sub), c["bwd_num_warps"], c["bwd_num_stages"]),
        (f"dk/dv storing dS, D {d}", "_attn_bwd_dkdv_kernel", dict(D=d, BLOCK_M=c["DKDV_BLOCK_M"],
                                                                   BLOCK_N=c["DS_DKDV_BLOCK_N"], FUSED=False,
                                                                   SUB=sub, DS_STORE=True),
         c["bwd_num_warps"], c["bwd_num_stages"]),
        (f"dq from stored dS, D {d}", "_attn_bwd_dq_ds_kernel", dict(D=d, BLOCK_M=c["DS_DQ_BLOCK_M"],
                                                                    TM=c["DKDV_BLOCK_M"], SUB=sub),
         c["ds_dq_num_warps"], c["ds_dq_num_stages"]),
    ]


def report(mod, name: str, kernel: str, const: dict, warps: int, stages: int, ttgir: Path | None = None,
           with_regions: bool = False) -> str:
    # lse's (and delta's) stride along the sequence is 1 ([B, H, S] contiguous): a launch makes it a constexpr 1
    const = {**dict(G=4, D=128, VARLEN=False, UPCAST=False, stride_ls=1), **const}
    types = dict(POINTERS)
    if const.get("TMA"):
        types["k_desc"] = types["v_desc"] = f"tensordesc<bf16[{const['BLOCK_N']},128]>"
    # as a real launch specializes them: the benchmarks' strides and sequence lengths (S = 1k .. 16k, head dim 128)
    # are divisible by 16
    fn = getattr(mod, kernel)
    aligned = [n for n in oc.signature(fn, const, types)[1] if n.startswith("stride_") or n == "seq_len"]
    k = oc.compile_sm90(fn, const, types, dict(num_warps=warps, num_stages=stages, enable_fp_fusion=False),
                        default_type=lambda n: "i32", aligned=aligned)
    ir = k.asm["ttgir"]
    if ttgir is not None:
        ttgir.mkdir(parents=True, exist_ok=True)
        (ttgir / (re.sub(r"\W+", "_", name) + ".ttgir")).write_text(ir)
    with tempfile.TemporaryDirectory() as d:  # assembled once: ptxas's report, and the SASS the regions count
        out = oc.assemble(k.asm["ptx"], Path(d) / "k.cubin")
        sass = oc.disassemble(Path(d) / "k.cubin") if with_regions else None
    regs = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    pend = sorted(set(re.findall(r"warp_group_dot_wait[^\n]*pendings = (\d+)", ir)))
    return (f"{name:38s} warps {warps} stages {stages}: registers {regs.group(1) if regs else '?'}, spill stores/loads "
            f"{'/'.join(spills.groups()) if spills else '?'} B, shared {k.metadata.shared} B, wgmma "
            f"{ir.count('warp_group_dot ')} (waits {ir.count('warp_group_dot_wait')}, pendings {','.join(pend)}), "
            f"async copies {ir.count('async_copy_global_to_local')}, TMA loads {ir.count('async_tma_copy')}"
            f"{', WGMMA SERIALIZED (ptxas C7515)' if 'C7515' in out else ''}"
            f"{', warp-specialized' if 'ttg.warp_specialize' in ir else ''}"
            + ("" if not with_regions else "\n    SASS instructions: " + "; ".join(
                f"{where} {n}" for where, n in regions(sass or "")) + "\n    innermost loops: " + "; ".join(
                f"{n} (spill stores {st}, loads {ld}, wgmma {mma})" for n, st, ld, mma in inner_loops(sass or ""))))


def regions(sass: str) -> list[tuple[str, int]]:
    """SASS instructions per region of a kernel's main body (up to its last EXIT; what follows is out-of-line slow
    paths, such as a barrier's retry, which branch back into it): before its first loop, each loop's body (a backward
    branch's span; loops inside it counted with it), between loops, after the last one. Static counts, not executed
    ones: a branch inside a body (a chunk edge's fold) counts whether taken or not."""
    _, end, spans = _body(sass)
    loops: list[tuple[int, int]] = []
    for start, stop in spans:
        loops = [lp for lp in loops if lp[0] < start]  # an enclosing loop replaces the ones inside it
        loops.append((start, stop))
    out, pos = [], 0
    for n, (a, b) in enumerate(loops):
        out.append(("before the first loop" if n == 0 else f"between loops {n} and {n + 1}", a - pos))
        out.append((f"loop {n + 1}", b - a))
        pos = b
    out.append(("after the last loop" if loops else "straight line", end - pos))
    return out


def _body(sass: str) -> tuple[list[str], int, list[tuple[int, int]]]:
    """(the SASS instructions in order, the end of the main body: after its last EXIT, and the body's loops: each
    backward branch's span [its target, the branch + 1], in the order of the branches)."""
    ins, at = [], {}
    for line in sass.splitlines():
        label = re.match(r"\s*\.(L_x_\d+):", line)
        if label:
            at[label.group(1)] = len(ins)
        op = re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if op:
            ins.append(op.group(1))
    end = max((i + 1 for i, text in enumerate(ins) if text.split()[-1] == "EXIT"), default=len(ins))
    spans = []
    for i, text in enumerate(ins[:end]):
        target = re.search(r"BRA\s+`\(\.(L_x_\d+)\)", text)
        if target and at.get(target.group(1), i + 1) <= i:
            spans.append((at[target.group(1)], i + 1))
    return ins, end, spans


def innermost(sass: str) -> list[list[str]]:
    """The instructions of each innermost loop of a kernel's main body (a backward branch's span holding no other)."""
    ins, _, spans = _body(sass)
    return [ins[a:b] for a, b in spans if not any((c, d) != (a, b) and a <= c and d <= b for c, d in spans)]


def inner_loops(sass: str) -> list[tuple[int, int, int, int]]:
    """The innermost loops of a kernel's main body, each as (instructions, spill stores, spill loads, wgmmas): where a
    kernel's spills run once a tile or chunk, and where they run at every key block (a warp-specialized kernel has one
    such loop per consumer partition)."""
    out = []
    for loop in innermost(sass):
        ops = [re.sub(r"^@!?\w+\s+", "", text).split(".")[0].split()[0] for text in loop]  # no predicate, modifiers
        out.append((len(ops), ops.count("STL"), ops.count("LDL"), ops.count("HGMMA")))
    return out


def decode_register_caps(mod) -> None:
    """The folded decode kernel (a cache of one chunk: a rollout's short contexts) at the short launch and its
    neighbours, uncapped and under register caps (decode_short_maxnreg): registers, spills, shared memory, and the
    programs an SM holds by each (a qwen3-0.6b decode batch of 64 is 512 programs; 132 SMs)."""
    c = mod._for_head_dim(dict(mod.CONFIG), 128)
    fn = mod._attn_decode_kernel
    for G in (2, 4):
        for warps, stages, cap in ((4, 1, 0), (4, 1, 168), (4, 1, 128), (4, 1, 112), (4, 2, 0), (4, 2, 128),
                                   (8, 1, 0), (8, 1, 64)):
            const = dict(G=G, D=128, VARLEN=False, UPCAST=False, BLOCK_M=c["DECODE_BLOCK_M"], BLOCK_N=c["BLOCK_N"],
                         CHUNK=c["CHUNK_BLOCKS"], CHUNKS_PER_PROG=1, FOLD=True, PDL=True)
            aligned = [n for n in oc.signature(fn, const, POINTERS)[1] if n.startswith("stride_")]
            opts = dict(num_warps=warps, num_stages=stages, enable_fp_fusion=False) | ({"maxnreg": cap} if cap else {})
            k = oc.compile_sm90(fn, const, dict(POINTERS), opts, default_type=lambda n: "i32", aligned=aligned)
            out = oc.assemble(k.asm["ptx"])
            regs = int(re.search(r"Used (\d+) registers", out).group(1))
            spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
            fit = oc.programs_per_sm(regs, k.metadata.shared, warps)
            print(f"decode folded, G {G}, warps {warps} stages {stages} maxnreg {cap or '-':>3}: registers {regs:3d}, "
                  f"spill stores/loads {'/'.join(spills.groups())} B, shared {k.metadata.shared} B; programs an SM: "
                  f"{fit['registers']} by registers, {fit['shared']} by shared memory", flush=True)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="only the cases whose name contains this")
    ap.add_argument("--source", type=Path, default=SOURCE, help="another copy of attention.py")
    ap.add_argument("--ttgir", type=Path, default=None, help="also write each case's TTGIR into this folder")
    ap.add_argument("--regions", action="store_true",
                    help="also each case's SASS instructions per region (before, in and between its loops, after), "
                         "and its innermost loops' instructions, spill stores and loads, and wgmmas")
    ap.add_argument("--head-dim", type=int, default=None,
                    help="instead of CASES: the launches the host makes at this head dim, each checked against an "
                         "H200's shared memory (exit 1 if one does not fit)")
    ap.add_argument("--decode-regs", action="store_true",
                    help="instead of CASES: the short-cache decode launch under register caps (`decode_register_caps`)")
    args = ap.parse_args()
    mod = load_module(args.source, "attention_sm90_offline")
    print(f"triton {triton.__version__}, {oc.ptxas_version()}")
    if args.decode_regs:
        return decode_register_caps(mod)
    if args.head_dim is not None:
        over = []
        for case in launch_cases(mod, args.head_dim):
            if args.only in case[0]:
                line = report(mod, *case, ttgir=args.ttgir)
                shared = int(re.search(r"shared (\d+) B", line).group(1))
                print(f"{line}  [{'fits' if shared <= SHARED_LIMIT else 'OVER the H200 limit'}]", flush=True)
                over += [case[0]] if shared > SHARED_LIMIT else []
        sys.exit(1 if over else 0)
    for case in CASES:
        if args.only in case[0]:
            print(report(mod, *case, ttgir=args.ttgir, with_regions=args.regions), flush=True)


if __name__ == "__main__":
    main()
