"""The lm_head kernels (logprob's forward, sample_logprob's pass, sample's forward) compiled for sm_90 on this machine
(no GPU: Triton's own ptxas), a revision's against this tree's, and this tree's with CHUNKS 2 and 4 and FLAT: PTX
registers declared, local-memory stores, shared memory, async copies, and ptxas's registers and spills a thread: that a
launch choice compiles, and keeps its values out of local memory, before a GPU times it (WITH_ENT: logprob's forward
with the entropy's partials beside, `logprob_entropy`).

Then the combine kernels (the chain over V chunks a decode batch runs in one program) at MERGE_STAGES 1 and 8: the
async copies in their PTX (the pipelined loads), then assembled with Triton's ptxas and disassembled (nvdisasm):
their global loads (L, async copies included) and exps (X) in program order, and how many loads go out before the
first exp waits on one, where the tools are there. Run it with the GPU's Triton on the path (PYTHONPATH=<a pip
--target dir of triton==3.6.0>) to see what the GPU would run.

    python benchmarks/lmhead_ptx_offline.py [REV] > benchmarks/results/lmhead_ptx_offline.txt

With --regs, instead: sample_logprob's pass (FLAT) at 3 and 4 stages under register caps (SLP_MAXNREG): ptxas's
registers and spills, its shared memory, and how many programs of 8 warps an SM then holds (by registers, by shared
memory).

With --backward, instead: logprob's backward grad kernels (grad_hidden = dz @ w, grad_w = dzᵀ @ hidden) as the
CONFIG launches them, with the dz scratch in fp32 and in bf16 (BWD_DZ_LOW) and grad_hidden's 64- and 128-row tiles
(BWD_GH_BLOCK_M): async copies, MMAs (wgmma, mma.sync), shared memory, ptxas's registers and spills.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import offline_compile as oc  # noqa: E402 (first: it turns the interpreter off before Triton is imported)

ROOT = oc.ROOT
F32, I64 = oc.F32, oc.I64
LSE = {"m_part_ptr": F32, "s_part_ptr": F32, "temperature": "fp32"}
RACE = {"seed_ptr": I64, "best_part_ptr": F32, "idx_part_ptr": I64, "temperature": "fp32"}
TILE = dict(BLOCK_T=64, BLOCK_V=128, BLOCK_K=64)
#: (operator file, kernel, constexprs, argument types other than bf16 pointers and i32 scalars)
CASES = [
    ("logprob", "_logprob_fwd_kernel", dict(TILE, V_CHUNK=512), {**LSE, "tgt_ptr": I64, "zt_ptr": F32,
                                                                 "a_part_ptr": F32}),
    ("logprob", "_sample_logprob_kernel", dict(TILE, V_CHUNK=512), {**LSE, **RACE, "zb_part_ptr": F32}),
    ("sample", "_sample_fwd_kernel", dict(TILE, GREEDY=False, V_CHUNK=1024), RACE),
]


def compiled(path: Path, kernel: str, const: dict, types: dict):
    """The kernel as a real launch specializes it (Qwen3's lm_head: hidden 1024 .. 4096): pointers 16-byte aligned,
    the row strides and the hidden size divisible by 16. Without it no load is vectorized or pipelined (no cp.async),
    and the registers and spills below are not the GPU's. Also its parameters."""
    fn = oc.kernel(path, kernel)
    const = dict(const)
    cap = const.pop("maxnreg", 0)  # a launch option, not a constexpr
    opts = {"num_warps": 8, "num_stages": 3} | ({"maxnreg": cap} if cap else {})
    k = oc.compile_sm90(fn, const, types, opts, aligned=("stride_h", "stride_w", "H"))
    return k, set(oc.signature(fn, {}, {})[1]) | ({"maxnreg"} if cap else set())


def ptx_stats(k) -> str:
    """One compiled kernel's line: async copies, MMAs, shared memory, ptxas's registers and spills a thread."""
    ptx = k.asm["ptx"]
    out = oc.assemble(ptx)
    used = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores", out)
    copies = ptx.count("cp.async.cg") + ptx.count("cp.async.ca")
    return (f"cp.async {copies:3d}, wgmma {ptx.count('wgmma.mma_async'):3d}, "
            f"mma.sync {ptx.count('mma.sync'):3d}, shared {k.metadata.shared:6d} B; ptxas: registers "
            f"{used.group(1) if used else '?'}, spill stores {spills.group(1) if spills else '?'} B")


#: the backward's grad kernels, logprob's and entropy's (ops/_lmhead.py since session 42)
BACKWARD_KERNELS = ("_grad_hidden_kernel", "_grad_weight_kernel")


def backward() -> int:
    """The backward's grad kernels at the CONFIG's launch, dz in fp32 and in bf16, grad_hidden at 64 and 128 rows."""
    import triton

    from tik_kernels.ops import logprob as LP

    cfg = LP.CONFIG
    opts = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    print(f"logprob backward, sm_90, Triton {triton.__version__}, num_warps {opts['num_warps']}, num_stages "
          f"{opts['num_stages']}, BLOCK_N {cfg['BWD_BLOCK_N']}, BLOCK_K {cfg['BWD_BLOCK_K']}; a launch's alignment "
          "(V, H, the row strides and a chunk's tokens divisible by 16)")
    aligned = ("n", "V", "H", "stride_w", "stride_gh", "stride_h")
    for kernel, rows in zip(BACKWARD_KERNELS, ((128, 64), (cfg["BWD_BLOCK_M"],)), strict=True):
        fn = oc.kernel(oc.op_path("_lmhead"), kernel)  # logprob's and entropy's since session 42
        for dz in (F32, "*bf16"):
            for bm in rows:
                for bk, stages in ((cfg["BWD_BLOCK_K"], opts["num_stages"]), (cfg["BWD_BLOCK_K"], 5), (64, 4)):
                    types = {"dz_ptr": dz, "gw_ptr": F32}
                    const = {"BLOCK_M": bm, "BLOCK_N": cfg["BWD_BLOCK_N"], "BLOCK_K": bk, "ACCUMULATE": True}
                    k = oc.compile_sm90(fn, const, types, {**opts, "num_stages": stages}, aligned=aligned)
                    print(f"{kernel:20s} dz {dz[1:]:5s} BLOCK_M {bm:3d} BLOCK_K {bk:2d} stages {stages}: "
                          f"{ptx_stats(k)}")
    return 0


def register_caps() -> int:
    """sample_logprob's pass at the CONFIG's tiles, 8 warps, 3 and 4 stages, uncapped and capped."""
    import triton

    _, kernel, const, types = CASES[1]
    fn = oc.kernel(oc.op_path("logprob"), kernel)
    print(f"sample_logprob's pass (FLAT), sm_90, Triton {triton.__version__}, 8 warps; programs an SM by registers "
          f"({oc.SM_REGS} a SM) and by shared memory ({oc.SM_SHARED} B)")
    for stages in (3, 4):
        for cap in (0, 128, 96, 80, 72):
            opts = {"num_warps": 8, "num_stages": stages} | ({"maxnreg": cap} if cap else {})
            k = oc.compile_sm90(fn, {**const, "FLAT": True}, types, opts, aligned=("stride_h", "stride_w", "H"))
            out = oc.assemble(k.asm["ptx"])
            regs = int(re.search(r"Used (\d+) registers", out).group(1))
            spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
            fit = oc.programs_per_sm(regs, k.metadata.shared, 8)
            print(f"stages {stages} maxnreg {cap or '-':>3}: registers {regs:3d}, spill stores/loads "
                  f"{spills.group(1)}/{spills.group(2)} B, shared {k.metadata.shared} B; programs an SM: "
                  f"{fit['registers']} by registers, {fit['shared']} by shared memory")
    return 0


def main() -> int:
    if "--backward" in sys.argv[1:]:
        return backward()
    if "--regs" in sys.argv[1:]:
        return register_caps()
    rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    print(f"sm_90, num_warps 8, num_stages 3; {rev} against this tree")
    with tempfile.TemporaryDirectory() as tmp:
        for op, kernel, const, types in CASES:
            old = Path(tmp) / f"{op}.py"
            old.write_text(subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:tik_kernels/ops/{op}.py"],
                                          check=True, capture_output=True, text=True).stdout)
            new = ROOT / "tik_kernels" / "ops" / f"{op}.py"
            for label, path, extra in ((rev, old, {}), ("this tree", new, {}), ("CHUNKS=2", new, {"CHUNKS": 2}),
                                       ("CHUNKS=4", new, {"CHUNKS": 4}), ("FLAT", new, {"FLAT": True}),
                                       ("WITH_ENT", new, {"WITH_ENT": True}),
                                       ("WITH_ENT128", new, {"WITH_ENT": True, "maxnreg": 128})):
                k, params = compiled(path, kernel, {**const, **extra}, types)
                if extra and not set(extra) <= set(params):
                    continue
                ptx = k.asm["ptx"]
                regs = sum(int(n) for n in re.findall(r"\.reg \.\w+\s+%\w+<(\d+)>", ptx))
                out = oc.assemble(ptx)
                used = re.search(r"Used (\d+) registers", out)
                spills = re.search(r"(\d+) bytes spill stores", out)
                print(f"{op:8s} {kernel:24s} {label:10s} PTX registers declared {regs:5d}, "
                      f"st.local {ptx.count('st.local')}, shared {k.metadata.shared} B, "
                      f"cp.async {ptx.count('cp.async.cg') + ptx.count('cp.async.ca')}; ptxas: registers "
                      f"{used.group(1) if used else '?'}, spill stores {spills.group(1) if spills else '?'} B")
    combines()
    return 0


#: (operator file, combine kernel, its argument types other than fp32 pointers and i32 scalars)
COMBINES = [
    ("logprob", "_logprob_combine_kernel", {}),
    ("logprob", "_sample_logprob_combine_kernel", {"idx_part_ptr": I64, "ids_ptr": I64}),
    ("sample", "_sample_combine_kernel", {"idx_part_ptr": I64, "out_ptr": I64}),
    ("entropy", "_entropy_combine_kernel", {}),
]


def sass_order(ptx: str) -> str | None:
    """The kernel's global loads (L), exps (X) and branches (B) in program order, or None without the tools."""
    text = oc.sass(ptx)
    if text is None:
        return None
    return "".join("L" if "LDG" in ln else "X" if "MUFU" in ln else "B" if "BRA" in ln else ""
                   for ln in text.splitlines())


def combines() -> None:
    import triton

    print(f"\ncombine kernels, sm_90, num_warps 4, BLOCK 128, Triton {triton.__version__}: global loads (L), exps (X), "
          "branches (B) in SASS order")
    for op, kernel, types in COMBINES:
        fn = oc.kernel(oc.op_path(op), kernel)
        for stages in (1, 8):
            k = oc.compile_sm90(fn, {"BLOCK": 128, "PDL": False, "MERGE_STAGES": stages}, types,
                                {"num_warps": 4, "num_stages": 3}, default_type=lambda n: F32 if n.endswith("_ptr")
                                else "i32")
            head = f"{op:8s} {kernel:32s} MERGE_STAGES={stages}  cp.async {k.asm['ptx'].count('cp.async'):3d}"
            order = sass_order(k.asm["ptx"])
            if order is None:
                print(f"{head}  (no ptxas / nvdisasm here)")
                continue
            first_x = order.find("X")
            ahead = order[:first_x].count("L") if first_x >= 0 else order.count("L")
            print(f"{head}  loads before the first exp {ahead:3d}  {order}")


if __name__ == "__main__":
    sys.exit(main())
