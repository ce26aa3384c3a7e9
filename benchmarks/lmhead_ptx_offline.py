"""The lm_head kernels (logprob's forward, sample_logprob's pass, sample's forward) compiled for sm_90 on this machine
(no GPU: Triton's own ptxas), a revision's against this tree's, and this tree's with CHUNKS 2 and 4: PTX registers
declared, local-memory stores and shared memory per kernel: that a launch choice compiles, and keeps its values out
of local memory in the PTX, before a GPU times it (ptxas's own spills show only where the cubin is loaded, on a GPU).

Then the combine kernels (the chain over V chunks a decode batch runs in one program) at MERGE_STAGES 1 and 8: the
async copies in their PTX (the pipelined loads), then assembled with Triton's ptxas and disassembled (nvdisasm):
their global loads (L, async copies included) and exps (X) in program order, and how many loads go out before the
first exp waits on one, where the tools are there. Run it with the GPU's Triton on the path (PYTHONPATH=<a pip
--target dir of triton==3.6.0>) to see what the GPU would run.

    python benchmarks/lmhead_ptx_offline.py [REV] > benchmarks/results/lmhead_ptx_offline.txt
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile, never interpret (before anything imports Triton)
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

F32, I64 = "*fp32", "*i64"
LSE = {"m_part_ptr": F32, "s_part_ptr": F32, "temperature": "fp32"}
RACE = {"seed_ptr": I64, "best_part_ptr": F32, "idx_part_ptr": I64, "temperature": "fp32"}
TILE = dict(BLOCK_T=64, BLOCK_V=128, BLOCK_K=64)
#: (operator file, kernel, constexprs, argument types other than bf16 pointers and i32 scalars)
CASES = [
    ("logprob", "_logprob_fwd_kernel", dict(TILE, V_CHUNK=512), {**LSE, "tgt_ptr": I64, "zt_ptr": F32}),
    ("logprob", "_sample_logprob_kernel", dict(TILE, V_CHUNK=512), {**LSE, **RACE, "zb_part_ptr": F32}),
    ("sample", "_sample_fwd_kernel", dict(TILE, GREEDY=False, V_CHUNK=1024), RACE),
]


def compiled(path: Path, kernel: str, const: dict, types: dict):
    import triton
    from triton.backends.compiler import GPUTarget

    from tik_kernels.contract import load_module

    fn = getattr(load_module(path, f"ptx_{abs(hash((str(path), kernel, str(const))))}"), kernel)
    params = inspect.signature(fn.fn).parameters
    c = {k: v for k, v in const.items() if k in params}
    sig = {}
    for n, prm in params.items():
        if n not in c and "constexpr" in str(prm.annotation) and prm.default is not inspect.Parameter.empty:
            c[n] = prm.default  # a constexpr the revision lacks or the case leaves at its default
        sig[n] = "constexpr" if n in c else types.get(n, "*bf16" if n.endswith("_ptr") else "i32")
    # as a real launch specializes them (Qwen3's lm_head: hidden 1024 .. 4096): pointers 16-byte aligned, the row
    # strides and the hidden size divisible by 16. Without it no load is vectorized or pipelined (no cp.async), and
    # the registers and spills below are not the GPU's
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(sig)
             if sig[n].startswith("*") or n in ("stride_h", "stride_w", "H")}
    return triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=c, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3}), params


def main() -> int:
    rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    print(f"sm_90, num_warps 8, num_stages 3; {rev} against this tree")
    with tempfile.TemporaryDirectory() as tmp:
        for op, kernel, const, types in CASES:
            old = Path(tmp) / f"{op}.py"
            old.write_text(subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:tik_kernels/ops/{op}.py"],
                                          check=True, capture_output=True, text=True).stdout)
            new = ROOT / "tik_kernels" / "ops" / f"{op}.py"
            for label, path, extra in ((rev, old, {}), ("this tree", new, {}), ("CHUNKS=2", new, {"CHUNKS": 2}),
                                       ("CHUNKS=4", new, {"CHUNKS": 4})):
                k, params = compiled(path, kernel, {**const, **extra}, types)
                if extra and not set(extra) <= set(params):
                    continue
                ptx = k.asm["ptx"]
                regs = sum(int(n) for n in re.findall(r"\.reg \.\w+\s+%\w+<(\d+)>", ptx))
                print(f"{op:8s} {kernel:24s} {label:10s} PTX registers declared {regs:5d}, "
                      f"st.local {ptx.count('st.local')}, shared {k.metadata.shared} B, "
                      f"cp.async {ptx.count('cp.async.cg') + ptx.count('cp.async.ca')}")
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
    nvidia = Path(__import__("triton").__file__).parent / "backends" / "nvidia" / "bin"
    arch = re.search(r"\.target (sm_\w+)", ptx).group(1)
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        for ptxas in ("ptxas", "ptxas-blackwell"):  # the one whose PTX version this Triton writes
            if (nvidia / ptxas).exists() and subprocess.run(
                    [str(nvidia / ptxas), f"--gpu-name={arch}", str(src), "-o", str(cubin)],
                    capture_output=True).returncode == 0:
                break
        else:
            return None
        if not (nvidia / "nvdisasm").exists():
            return None
        sass = subprocess.run([str(nvidia / "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True).stdout
    return "".join("L" if "LDG" in ln else "X" if "MUFU" in ln else "B" if "BRA" in ln else ""
                   for ln in sass.splitlines())


def combines() -> None:
    import triton
    from triton.backends.compiler import GPUTarget

    from tik_kernels.contract import load_module

    print(f"\ncombine kernels, sm_90, num_warps 4, BLOCK 128, Triton {triton.__version__}: global loads (L), exps (X), "
          "branches (B) in SASS order")
    for op, kernel, types in COMBINES:
        fn = getattr(load_module(ROOT / "tik_kernels" / "ops" / f"{op}.py", f"ptx_{op}_combine"), kernel)
        params = inspect.signature(fn.fn).parameters
        for stages in (1, 8):
            const = {k: v for k, v in {"BLOCK": 128, "PDL": False, "MERGE_STAGES": stages}.items() if k in params}
            sig = {n: "constexpr" if n in const else types.get(n, F32 if n.endswith("_ptr") else "i32")
                   for n in params}
            k = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=const),
                               target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
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
