"""How many rounds each kernel of a decode step runs in on a Hopper GPU, worked out on a machine without one.

    PYTHONPATH=<a pip --target dir of triton==3.6.0>:. python benchmarks/occupancy_offline.py \
        [--preset qwen3-0.6b] [--batch 64] [--context 128] [--sms 132] [--set OP.KEY=VALUE ...] [--out FILE.md]

A kernel whose programs do not all fit on the GPU at once runs in rounds, and a last round that is only partly full
leaves SMs idle while it runs; a decode step is a few hundred such launches. Two steps:

1. In a child process on the Triton interpreter, one decode step of the unified backend (`forward_decode`, then
   `sample_logprob`, as `decode_breakdown.py` runs it) at the preset's real shapes, with every Triton launch recorded
   (kernel, grid, argument types, constexprs, launch options) instead of run: the host code's decisions (tiles,
   splits, warps, register caps) at these shapes, in a few seconds.
2. Here, each distinct launch compiled for sm_90 as the GPU would specialize it (integer arguments divisible by 16,
   1 as a constant; pointers aligned), and ptxas's registers and the shared memory read off: the programs an SM holds
   (by registers: 65536 a SM, allocated 8 a thread at a time; by shared memory: 233472 B less 1 KB a block; by
   threads: 2048; by blocks: 32), the grid's programs, the rounds, and how full the last one is.

Run it with the GPU's Triton first on the path: this machine's may be another version.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: torch dtype -> Triton's pointer type names
POINTER = {"torch.bfloat16": "bf16", "torch.float32": "fp32", "torch.float16": "fp16", "torch.int32": "i32",
           "torch.int64": "i64", "torch.int8": "i8", "torch.uint8": "u8", "torch.bool": "i1"}
OPTIONS = ("num_warps", "num_stages", "maxnreg", "enable_fp_fusion", "launch_pdl")


# ----------------------------------------------------------------------------- step 1: the launches (interpreter)


def _describe(value) -> dict:
    """An argument as the compile needs it: its type, and whether a launch would find it aligned / equal to 1."""
    import torch

    if isinstance(value, torch.Tensor):
        return {"type": "*" + POINTER[str(value.dtype)], "aligned": value.data_ptr() % 16 == 0}
    if hasattr(value, "block_shape") and hasattr(value, "base"):  # a TMA TensorDescriptor
        dtype = POINTER[str(value.base.dtype)]
        return {"type": f"tensordesc<{dtype}[{','.join(str(b) for b in value.block_shape)}]>"}
    if isinstance(value, bool):
        return {"type": "i1", "value": value}
    if isinstance(value, int):
        return {"type": "i32" if -(2**31) <= value < 2**31 else "i64", "value": value}
    if isinstance(value, float):
        return {"type": "fp32"}
    if value is None:
        return {"type": "none"}
    return {"type": f"unsupported:{type(value).__name__}"}


def record(preset: str, batch: int, context: int, overrides: list[str], train: tuple[int, int, int] | None = None
           ) -> list[dict]:
    """One decode step's Triton launches (`decode_breakdown.record_step`'s step), recorded instead of run (the
    interpreter: this process must not have imported Triton for a GPU). `overrides`: OP.KEY=VALUE CONFIG values
    (`decode_breakdown.apply_overrides`). `train` = (sequences, prompt tokens, answer tokens): instead, one minibatch
    update's training forward and backward (`sequence_logprobs` with gradients, packed sequences of that shape)."""
    import importlib
    import inspect
    import pkgutil

    import torch
    from decode_breakdown import apply_overrides, record_step
    from triton.runtime.interpreter import InterpretedFunction

    import tik_kernels.ops
    from tik_kernels.e2e.backends import make_backend
    from tik_kernels.e2e.model import PRESETS, KVCache, bf16_weights, init_params

    launches: list[dict] = []

    def recorder(self, grid):
        fn = self.fn
        params = inspect.signature(fn).parameters

        def launch(*args, **kwargs):
            bound = dict(zip(params, args, strict=False)) | {k: v for k, v in kwargs.items() if k in params}
            constexpr = {n for n, p in params.items() if "constexpr" in str(p.annotation)}
            meta = {n: v for n, v in bound.items() if n in constexpr}
            g = grid(meta | kwargs) if callable(grid) else grid
            g = tuple(int(x) for x in (g if isinstance(g, tuple | list) else (g,)))
            launches.append({
                "file": inspect.getsourcefile(fn), "kernel": fn.__name__, "grid": list(g),
                "constexprs": {n: v for n, v in meta.items() if isinstance(v, int | float | bool | str | type(None))},
                "args": {n: _describe(v) for n, v in bound.items() if n not in constexpr},
                "options": {k: v for k, v in kwargs.items() if k in OPTIONS},
            })

        return launch

    InterpretedFunction.__getitem__ = recorder
    # the host code as on a GPU: its tiles, UPCAST and PDL are the GPU's, not the interpreter's (nothing here runs a
    # kernel, so nothing needs the interpreter's choices)
    for info in pkgutil.iter_modules(tik_kernels.ops.__path__):
        module = importlib.import_module(f"tik_kernels.ops.{info.name}")
        if hasattr(module, "INTERPRET"):
            module.INTERPRET = False
    tik_kernels.ops._common.pdl_capable = lambda device: True
    apply_overrides(overrides)
    mc = PRESETS[preset]
    params = init_params(mc, 0, "cpu")
    if train is not None:
        from tik_kernels.e2e.trainer import Packed, sequence_logprobs

        n, p, a = train
        cu = torch.arange(n + 1, dtype=torch.int32) * (p + a - 1)
        rows = torch.cat([torch.arange(s + p - 1, s + p - 1 + a) for s in cu[:-1].tolist()])
        packed = Packed(torch.randint(1, mc.vocab, (int(cu[-1]),)), cu, rows, torch.randint(1, mc.vocab, (n * a,)),
                        torch.arange(n).repeat_interleave(a), [p + a - 1] * n)
        ws = {k: v.requires_grad_(True) for k, v in params.items()}
        lp, _ = sequence_logprobs(mc, make_backend("unified"), ws, packed, 1.0, grad=True)
        lp.sum().backward()
        return launches
    record_step(mc, make_backend("unified"), bf16_weights(params, grad=False), KVCache(mc, batch, context, "cpu"),
                batch, context)
    return launches


# ----------------------------------------------------------------------------- step 2: compiled for sm_90


def occupancy(launches: list[dict], sms: int) -> list[dict]:
    """Each distinct launch with its count, compiled for sm_90: registers, shared memory, programs an SM, rounds."""
    import re

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import offline_compile as oc  # turns the interpreter off before Triton is imported here

    groups: dict[str, dict] = {}
    for la in launches:
        key = json.dumps({k: la[k] for k in ("file", "kernel", "grid", "constexprs", "args", "options")},
                         sort_keys=True)
        groups.setdefault(key, {**la, "count": 0})["count"] += 1
    compiled: dict[str, tuple] = {}
    rows = []
    for g in groups.values():
        const = dict(g["constexprs"])
        types, aligned = {}, []
        for name, a in g["args"].items():
            if a["type"] == "none" or a.get("value") == 1:  # Triton makes None and 1 constants of the launch
                const[name] = None if a["type"] == "none" else 1
            else:
                types[name] = a["type"]
                if a["type"] in ("i32", "i64") and a.get("value", 1) % 16 == 0:
                    aligned.append(name)
        opts = {"num_warps": 4, "num_stages": 3, **g["options"]}
        ckey = json.dumps([g["file"], g["kernel"], const, types, aligned, opts], sort_keys=True, default=str)
        if ckey not in compiled:
            fn = oc.kernel(Path(g["file"]), g["kernel"])
            k = oc.compile_sm90(fn, const, types, opts, default_type=lambda n: "i32", aligned=aligned)
            out = oc.assemble(k.asm["ptx"])
            regs = int(re.search(r"Used (\d+) registers", out).group(1))
            spills = re.search(r"(\d+) bytes spill stores", out)
            compiled[ckey] = (regs, int(spills.group(1)) if spills else 0, k.metadata.shared, opts["num_warps"])
        regs, spill, shared, warps = compiled[ckey]
        per_sm = min(oc.programs_per_sm(regs, shared, warps).values())
        programs = 1
        for x in g["grid"]:
            programs *= x
        slots = per_sm * sms
        rounds = -(-programs // slots)
        rows.append({"kernel": g["kernel"], "file": Path(g["file"]).stem, "count": g["count"], "grid": g["grid"],
                     "programs": programs, "warps": warps, "stages": opts.get("num_stages"),
                     "maxnreg": opts.get("maxnreg"), "registers": regs, "spill_stores": spill, "shared": shared,
                     "per_sm": per_sm, "rounds": rounds,
                     "last_round_full": round((programs - (rounds - 1) * slots) / slots, 3)})
    return rows


def markdown(rows: list[dict], head: str) -> str:
    lines = [head, "", "| kernel | calls | grid | programs | warps / stages / maxnreg | registers (spill B) "
             "| shared B | programs an SM | rounds | last round full |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (-r["rounds"], r["file"], r["kernel"])):
        launch = f"{r['warps']} / {r['stages']} / {r['maxnreg'] or '-'}"
        lines.append(f"| {r['file']}.{r['kernel']} | {r['count']} | {r['grid']} | {r['programs']} | {launch} | "
                     f"{r['registers']} ({r['spill_stores']}) | {r['shared']} | {r['per_sm']} | {r['rounds']} | "
                     f"{r['last_round_full']:.0%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--sms", type=int, default=132, help="SMs of the GPU (132: an H100 or H200 SXM)")
    ap.add_argument("--set", action="append", default=[], metavar="OP.KEY=VALUE", help="a CONFIG value for the step")
    ap.add_argument("--train", type=int, nargs=3, default=None, metavar=("SEQS", "PROMPT", "ANSWER"),
                    help="instead of a decode step: one minibatch update's forward and backward over SEQS packed "
                         "sequences of PROMPT + ANSWER tokens (the e2e minibatch run: 64 112 56)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here (markdown)")
    ap.add_argument("--record", type=Path, default=None, help=argparse.SUPPRESS)  # the child's step 1
    args = ap.parse_args(argv)
    if args.record is not None:
        args.record.write_text(json.dumps(record(args.preset, args.batch, args.context, args.set, args.train)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "launches.json"
        env = {**os.environ, "TRITON_INTERPRET": "1",
               "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        cmd = [sys.executable, __file__, "--preset", args.preset, "--batch", str(args.batch), "--context",
               str(args.context), "--record", str(path), *[f"--set={s}" for s in args.set],
               *(["--train", *map(str, args.train)] if args.train else [])]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            print(f"occupancy_offline: recording the step failed: {(run.stderr.strip().splitlines() or ['?'])[-1]}",
                  file=sys.stderr)
            return 1
        launches = json.loads(path.read_text())
    rows = occupancy(launches, args.sms)
    import triton

    what = (f"One minibatch update's forward and backward ({args.train[0]} sequences of {args.train[1]} + "
            f"{args.train[2]} tokens)" if args.train else f"A decode step (batch {args.batch}, context {args.context})")
    head = (f"# {what}: its launches on {args.sms} SMs (sm_90, Triton {triton.__version__}, offline)\n\n"
            f"`{' '.join(['python benchmarks/occupancy_offline.py', *(argv if argv is not None else sys.argv[1:])])}`"
            f"  \n{args.preset}"
            + (f", {' '.join(args.set)}" if args.set else "") + f": {len(launches)} launches, {len(rows)} distinct")
    text = markdown(rows, head)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
