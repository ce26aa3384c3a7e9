"""What the compiler made of a linear root's launches on this GPU: registers, spills, shared memory, pipelining.

    PYTHONPATH=. python benchmarks/kernel_ir.py tik_kernels.ops.linear.py 128,128,8,3,1,0 16,64,4,6,2,4 \
        [--shape 4096,4096,4096]

Each launch is the module's `_matmul` tile tuple (linear.py: BLOCK_M,BLOCK_N,num_warps,num_stages,K_UNROLL;
linear_tree.py: the same and SPLIT). The kernel is launched for real on bf16 inputs of the shape (M,N,K), so
Triton specializes it as the entry point would (unit strides, divisibility), and the compiled kernels that
appear in its cache are reported: registers and spills per thread, shared memory, and counts in the TTGIR
that say whether the K loop was pipelined (async copies or TMA loads) and how many wgmma waits it holds.
Needs a GPU: the CPU interpreter compiles nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch


def compiled(fn) -> list:
    """Every compiled kernel of a @triton.jit function, across Triton versions (3.6 keeps them per device)."""
    caches = getattr(fn, "device_caches", None)
    if caches is not None:
        return [k for entry in caches.values() for k in entry[0].values()]
    return [k for per_dev in getattr(fn, "cache", {}).values() for k in per_dev.values()]


def describe(k) -> dict:
    ir = k.asm.get("ttgir", "")
    if hasattr(k, "_init_handles"):
        k._init_handles()
    return {"regs": getattr(k, "n_regs", None), "spills": getattr(k, "n_spills", None), "shared": k.metadata.shared,
            "async_copies": ir.count("async_copy_global_to_local"), "tma_loads": ir.count("async_tma_copy"),
            "wgmma": ir.count("warp_group_dot "), "wgmma_waits": ir.count("warp_group_dot_wait"),
            "warps": k.metadata.num_warps, "stages": k.metadata.num_stages}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("launches", nargs="+")
    ap.add_argument("--shape", default="4096,4096,4096", help="M,N,K of the launch (default 4096,4096,4096)")
    ap.add_argument("--kernel", default="_linear_fwd_kernel")
    ap.add_argument("--config", nargs="*", default=[], metavar="KEY=INT", help="override the module's CONFIG")
    a = ap.parse_args()
    try:
        M, N, K = map(int, a.shape.split(","))
        tiles = [tuple(map(int, launch.split(","))) for launch in a.launches]
        config = {key: int(val) for key, val in (kv.split("=") for kv in a.config)}
    except ValueError:
        raise SystemExit("kernel_ir: --shape is M,N,K, each launch and each --config value integers "
                         "(KEY=INT)") from None
    if not Path(a.path).is_file():
        raise SystemExit(f"kernel_ir: no file {a.path}")
    if not torch.cuda.is_available():
        raise SystemExit("kernel_ir: needs a GPU (the interpreter compiles nothing)")
    spec = importlib.util.spec_from_file_location("kernel_under_test", a.path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = getattr(mod, a.kernel)
    mod.CONFIG.update(config)
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    w = torch.randn(N, K, device="cuda").to(torch.bfloat16)
    print(f"{a.path} at M,N,K = {M},{N},{K}")
    for launch, tile in zip(a.launches, tiles, strict=True):
        before = {id(k) for k in compiled(fn)}
        try:
            mod._matmul(x, w, tile=tile)
            torch.cuda.synchronize()
        except Exception as e:  # one launch that does not compile does not hide the others
            print(f"  {launch}: {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}", flush=True)
            continue
        new = [k for k in compiled(fn) if id(k) not in before] or compiled(fn)[-1:]
        for k in new:
            print(f"  {launch}: {describe(k)}", flush=True)


if __name__ == "__main__":
    main()
