"""What ptxas makes of the rope's angle step for sm_90, without a GPU: the rope kernel and the rollout's fused q / k
norms + rope + cache fill (`rmsnorm_pair_rope_cache`), at Qwen3's head width (128) and the launches' own tiles.

    PYTHONPATH=<a pip --target dir of triton==3.6.0>:. python benchmarks/rope_offline.py

`_cos_sin` reduces each angle to [-pi, pi] before `tl.cos` / `tl.sin`, but libdevice's sinf / cosf cannot know that:
every call carries its slow path for large arguments (Payne-Hanek: a 32-byte local array, stores and loads to local
memory), never run here. Each line: registers a thread, the stack frame, local loads / stores in the SASS (that slow
path's), SASS lines, and the cos / sin values a thread computes (angles in the tile over the launch's threads): the
fused kernel takes every row's angles, so a token's are computed once for each of its heads.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import offline_compile as oc  # noqa: E402 (first: it turns the interpreter off before Triton is imported)
import triton  # noqa: E402
from gluon_offline import assembled  # noqa: E402

TYPES = {"pos_ptr": "*i64", "slot_ptr": "*i64", "rstd_ptr": "*fp32", "eps": "fp32", "log2_theta": "fp32"}
HEAD_DIM = 128


def report(name: str, fn, const: dict, warps: int, angles: int) -> str:
    """One kernel as a launch specializes it: pointers aligned, strides divisible by 16 (arguments not in TYPES: bf16
    pointers and i32, `offline_compile.bf16_pointers`)."""
    aligned = [n for n in oc.signature(fn, const, TYPES)[1] if n.startswith("stride_")]
    k = oc.compile_sm90(fn, const, TYPES, dict(num_warps=warps, num_stages=1, enable_fp_fusion=False), aligned=aligned)
    out, sass = assembled(k)
    regs = re.search(r"Used (\d+) registers", out)
    frame = re.search(r"(\d+) bytes stack frame", out)
    ldl, stl = (len(re.findall(rf"\b{op}\b", sass)) for op in ("LDL", "STL"))
    lines = sass.count("\n")
    return (f"{name:46s} warps {warps}: registers {regs.group(1) if regs else '?'}, stack frame "
            f"{frame.group(1) if frame else '?'} B, local loads / stores {ldl} / {stl}, SASS lines {lines}, "
            f"cos / sin a thread {angles / (32 * warps):g}")


def cases() -> list[tuple[str, object, dict, int, int]]:
    """(name, kernel, constexprs, warps, angles a program) of each launch reported."""
    from tik_kernels.ops import rmsnorm as N
    from tik_kernels.ops import rope as R

    half, out = HEAD_DIM // 2, []
    for bt in (R.CONFIG["BLOCK_T"], 1):  # the CONFIG tile, and FILL's smallest (a decode step's few tokens)
        const = dict(SIGN=1, HALF=half, BLOCK_T=bt, BLOCK_HQ=16, BLOCK_HK=8, BLOCK_HALF=half, PDL=True)
        out.append((f"rope, {bt} token(s) a program", R._rope_kernel, const, R.CONFIG["num_warps"], bt * half))
    # the norm's own tile, which the fused kernel keeps (its rows' bits are rmsnorm_pair's), the halves read back
    # after a barrier, then from registers (ROPE_REGS)
    block_r, block_h, warps = N._tile(HEAD_DIM)
    for regs in (False, True):
        const = dict(BLOCK_R=block_r, BLOCK_H=block_h, PAIR=True, PDL=True, ROPE=True, HALF=half, BLOCK_HALF=half,
                     ROPE_REGS=regs)
        out.append((f"q / k norms + rope + cache, {block_r} rows{', ROPE_REGS' if regs else ''}",
                    N._rmsnorm_fwd_kernel, const, warps, block_r * half))
    return out


def main() -> None:
    print(f"triton {triton.__version__}, {oc.ptxas_version()}; head dim {HEAD_DIM}")
    for name, fn, const, warps, angles in cases():
        print(report(name, fn, const, warps, angles))


if __name__ == "__main__":
    main()
