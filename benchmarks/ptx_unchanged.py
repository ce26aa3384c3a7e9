"""Whether a change left the decode step's kernels (and the prefill forward, the dq kernel) as the compiler makes them:
sm_90 PTX, here against a git revision.

    PYTHONPATH=. python benchmarks/ptx_unchanged.py [--rev HEAD] [--out FILE]

Compiles each listed kernel of this tree's operator files and of the same files at REV (with the operator modules
they import, `_lmhead`, `_common` and the jit functions one operator takes from another, at REV too: `at_rev`) for
sm_90 on this machine
(no GPU needed: Triton's own ptxas) with the same constexprs, the launch options a change added left at their defaults
(PDL and PREFETCH off), and compares the PTX instruction for instruction (source line markers, comments and debug
sections dropped: they follow the file's line numbers). "identical" means the GPU runs the kernel it ran before
("identical but for its parameters": the same instructions, an argument added that this launch leaves unused;
"identical but for register numbering": the same instructions in the same order reading and writing the same values,
the virtual registers numbered otherwise (a renaming one to one, `canonical`; the declared counts of the classes that
differ beside it); "... in another order": the same multiset of instructions, a few lines swapped by the scheduler:
read the diff); the PDL-on variants of the kernels that take PDL are compiled too and must hold griddepcontrol.wait
(and, with PREFETCH, the prefetches before it).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import offline_compile as oc  # noqa: E402 (first: it turns the interpreter off before Triton is imported)

ROOT = oc.ROOT
F32, I32, I64 = oc.F32, oc.I32, oc.I64
#: attention's fp32 and int pointers and fp32 scalars (the rest: bf16 pointers, i32 scalars)
ATTN = {"lse_ptr": F32, "delta_ptr": F32, "cu_ptr": I32, "ws_ptr": F32, "cnt_ptr": I32, "t_ptr": F32,
        "qk_scale": "fp32", "sm_scale": "fp32", "ds_ptr": "*bf16", "ds_base_ptr": I64, "ds_tile_ptr": I64}
#: (operator file, kernel, constexprs, argument types other than bf16 pointers and i32 scalars, compile options)
CASES = [
    ("rmsnorm", "_rmsnorm_fwd_kernel", dict(BLOCK_R=32, BLOCK_H=128, w2_ptr=None, n_first=0),
     {"rstd_ptr": F32, "eps": "fp32"}, dict(num_warps=8)),
    *(("rmsnorm", "_rmsnorm_fwd_kernel", dict(BLOCK_R=16, BLOCK_H=128, PAIR=True, ROPE=True, HALF=64, BLOCK_HALF=64,
                                              ROPE_REGS=regs),
       {"rstd_ptr": F32, "eps": "fp32", "pos_ptr": I64, "slot_ptr": I64, "log2_theta": "fp32"}, dict(num_warps=4))
      for regs in (False, True)),
    ("add_rmsnorm", "_add_rmsnorm_fwd_kernel", dict(BLOCK_R=4, BLOCK_H=1024), {"rstd_ptr": F32, "eps": "fp32"},
     dict(num_warps=8)),
    ("silu_mul", "_silu_mul_fwd_kernel", dict(BLOCK_T=1, BLOCK_F=1024), {}, dict(num_warps=4)),
    ("rope", "_rope_kernel", dict(SIGN=1, HALF=64, BLOCK_T=1, BLOCK_HQ=16, BLOCK_HK=8, BLOCK_HALF=64, v_ptr=None,
                                  slot_ptr=None, kc_ptr=None, vc_ptr=None, stride_vt=0, stride_vh=0, stride_cs=0,
                                  stride_ch=0, stride_cp=0), {"log2_theta": "fp32", "pos_ptr": I64},
     dict(num_warps=4)),
    ("linear", "_linear_fwd_kernel", dict(BLOCK_M=64, BLOCK_N=16, BLOCK_K=64, KCHUNK=2048, K_UNROLL=1, GROUP_M=8,
                                          SPLIT=True, FUSED=True, EVEN_K=True, UPCAST=False),
     {"ws_ptr": F32, "cnt_ptr": I32}, dict(num_warps=4, num_stages=6)),
    ("linear", "_linear_combine_kernel", dict(BLOCK=1024), {"ws_ptr": F32}, dict(num_warps=4)),
    ("attention", "_attn_decode_kernel", dict(G=2, D=128, BLOCK_M=16, BLOCK_N=128, CHUNK=4, CHUNKS_PER_PROG=1,
                                              FOLD=False, UPCAST=False, FUSED=True, GROUP=8),
     {"wm_ptr": F32, "wl_ptr": F32, "wa_ptr": F32, "lens_ptr": I32, "cnt_ptr": I32, "qk_scale": "fp32"},
     dict(num_warps=8, num_stages=3)),
    ("attention", "_attn_decode_combine_kernel", dict(G=2, BLOCK_G=2, BLOCK_D=32, CHUNK_KEYS=512, GROUP=8),
     {"wm_ptr": F32, "wl_ptr": F32, "wa_ptr": F32, "lens_ptr": I32}, dict(num_warps=1)),
    ("attention", "_attn_fwd_kernel", dict(G=4, D=128, BLOCK_M=128, BLOCK_N=128, CHUNK=4, VARLEN=False, UPCAST=False,
                                            TOTAL_IN_MEMORY=False, TMA=True),
     {**ATTN, "k_desc": "tensordesc<bf16[128,128]>", "v_desc": "tensordesc<bf16[128,128]>"},
     dict(num_warps=8, num_stages=2, enable_fp_fusion=False)),
    ("attention", "_attn_bwd_dq_kernel", dict(G=4, D=128, BLOCK_M=128, BLOCK_N=64, SUB=64, VARLEN=False, UPCAST=False,
                                              TMA=False), ATTN,
     dict(num_warps=8, num_stages=2, enable_fp_fusion=False)),
    ("logprob", "_sample_logprob_kernel", dict(BLOCK_T=64, BLOCK_V=128, BLOCK_K=64, V_CHUNK=512),
     {"m_part_ptr": F32, "s_part_ptr": F32, "temperature": "fp32", "seed_ptr": I64, "best_part_ptr": F32,
      "idx_part_ptr": I64, "zb_part_ptr": F32}, dict(num_warps=8, num_stages=3)),
    ("logprob", "_sample_logprob_combine_kernel", dict(BLOCK=128),
     {"m_part_ptr": F32, "s_part_ptr": F32, "best_part_ptr": F32, "idx_part_ptr": I64, "zb_part_ptr": F32,
      "ids_ptr": I64, "out_ptr": F32}, dict(num_warps=4)),
    # the trainer's lm_head forward (and the recompute's), without the entropy beside (WITH_ENT's default)
    ("logprob", "_logprob_fwd_kernel", dict(BLOCK_T=64, BLOCK_V=128, BLOCK_K=64, V_CHUNK=512),
     {"tgt_ptr": I64, "m_part_ptr": F32, "s_part_ptr": F32, "zt_ptr": F32, "a_part_ptr": F32, "temperature": "fp32"},
     dict(num_warps=8, num_stages=3)),
    ("logprob", "_logprob_combine_kernel", dict(BLOCK=128, MERGE_STAGES=8),
     {"m_part_ptr": F32, "s_part_ptr": F32, "zt_ptr": F32, "out_ptr": F32, "lse_ptr": F32, "a_part_ptr": F32,
      "ent_ptr": F32}, dict(num_warps=4)),
    ("entropy", "_entropy_combine_kernel", dict(BLOCK=128, MERGE_STAGES=8),
     {"m_part_ptr": F32, "s_part_ptr": F32, "a_part_ptr": F32, "out_ptr": F32, "lse_ptr": F32}, dict(num_warps=4)),
    # the trainer's lm_head backward, its dz scratch in fp32 (the CONFIG's)
    ("logprob", "_logprob_bwd_dz_kernel", dict(BLOCK_T=64, BLOCK_V=128, BLOCK_K=64),
     {"tgt_ptr": I64, "lse_ptr": F32, "g_ptr": F32, "dz_ptr": F32, "temperature": "fp32"},
     dict(num_warps=8, num_stages=3)),
    # logprob's and entropy's grad_hidden and grad_w (ops/_lmhead.py since session 42)
    ("_lmhead", "_grad_hidden_kernel", dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32), {"dz_ptr": F32},
     dict(num_warps=8, num_stages=3)),
    ("_lmhead", "_grad_weight_kernel", dict(ACCUMULATE=True, BLOCK_M=128, BLOCK_N=128, BLOCK_K=32),
     {"dz_ptr": F32, "gw_ptr": F32}, dict(num_warps=8, num_stages=3)),
    # the sampler and the entropy bonus: the logits tile and the backward's grad kernels they share with logprob
    ("sample", "_sample_fwd_kernel", dict(GREEDY=False, BLOCK_T=64, BLOCK_V=128, BLOCK_K=64, V_CHUNK=1024),
     {"seed_ptr": I64, "best_part_ptr": F32, "idx_part_ptr": I64, "temperature": "fp32"},
     dict(num_warps=8, num_stages=3)),
    ("entropy", "_entropy_fwd_kernel", dict(BLOCK_T=64, BLOCK_V=128, BLOCK_K=64, V_CHUNK=512),
     {"m_part_ptr": F32, "s_part_ptr": F32, "a_part_ptr": F32, "temperature": "fp32"},
     dict(num_warps=8, num_stages=3)),
    ("entropy", "_entropy_bwd_dz_kernel", dict(BLOCK_T=64, BLOCK_V=128, BLOCK_K=64),
     {"lse_ptr": F32, "ent_ptr": F32, "g_ptr": F32, "dz_ptr": F32, "temperature": "fp32"},
     dict(num_warps=8, num_stages=3)),
]


def ptx(path: Path, kernel: str, const: dict, types: dict, opts: dict, extra: dict | None = None) -> str:
    """The kernel's sm_90 PTX (unspecialized: both versions compiled alike) without line markers, comments and debug
    sections."""
    c = {**const, **(extra or {})}
    k = oc.compile_sm90(oc.kernel(path, kernel), c, types, {**opts, "launch_pdl": bool(c.get("PDL"))})
    return oc.plain_ptx(k.asm["ptx"])


def instructions(text: str) -> str:
    """PTX without its parameter declarations and with parameter loads unnumbered: a kernel that gained an argument
    it does not use (a pointer for a constexpr branch left off) compiles to the same instructions, its parameters
    renumbered."""
    kept = (ln for ln in text.splitlines() if not ln.lstrip().startswith(".param"))
    return re.sub(r"_param_\d+", "_param", "\n".join(kept))


#: a virtual register (`%r12`, `%rd3`, `%p1`, `%rs7`, `%f2`, ...): letters then a number; the special registers
#: `%tid.x`, `%ctaid.y`, `%laneid`, ... have no number, and those that do are kept by name (`SPECIAL`)
REGISTER = re.compile(r"%([A-Za-z]+)(\d+)\b")
SPECIAL = {"clock", "pm", "envreg"}  # %clock64, %pm0..7, %envreg0..31
#: a register class's declaration, `.reg .b32 %r<117>;`: its count changes with the numbering
DECLARED = re.compile(r"\s*\.reg\s+\.\w+\s+%([A-Za-z]+)<(\d+)>;")


def canonical(text: str) -> str:
    """PTX with its virtual registers renamed `%<class>_<n>` in the order each class's registers first appear, and
    the declarations of their counts dropped: two kernels that differ only in how LLVM numbered the registers have the
    same canonical text, and two with the same canonical text differ only in that (each register of one is always the
    same register of the other, and no two of one are one of the other: a renaming one to one)."""
    names: dict[str, str] = {}
    seen: dict[str, int] = {}

    def rename(m: re.Match) -> str:
        cls = m.group(1)
        if cls in SPECIAL:
            return m.group(0)
        if m.group(0) not in names:
            seen[cls] = seen.get(cls, 0) + 1
            names[m.group(0)] = f"%{cls}_{seen[cls]}"
        return names[m.group(0)]

    return "\n".join(REGISTER.sub(rename, ln) for ln in text.splitlines() if not DECLARED.fullmatch(ln))


def declared(text: str) -> dict[str, int]:
    """The register counts PTX declares, by class (`{"r": 117, "rd": 47, ...}`)."""
    return {m.group(1): int(m.group(2)) for m in map(DECLARED.fullmatch, text.splitlines()) if m}


#: an import of another operator module (`from tik_kernels.ops.X import ...`, `from tik_kernels.ops import X`)
OPS_IMPORT = re.compile(r"from tik_kernels\.ops\.(\w+) import|from tik_kernels\.ops import (\w+)\b")


def _show(rev: str, name: str) -> str:
    """tik_kernels/ops/<name>.py as it was at `rev` (CalledProcessError where `rev` lacks it)."""
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:tik_kernels/ops/{name}.py"], check=True,
                          capture_output=True, text=True).stdout


def at_rev(rev: str, op: str, tmp: Path, made: dict[str, str | None]) -> str:
    """Operator file `op` as it was at `rev`, its imports of other operator modules (the shared lm_head pieces,
    `_common`'s PDL helpers, one operator's jit functions in another's kernels) pointed at their copies at `rev`
    too, written beside it in `tmp` (on sys.path while the cases compile): so a kernel is compiled at `rev` with
    everything it calls at `rev`, not with this tree's shared pieces. A module `rev` lacks stays this tree's.
    `made` (module -> its copy's name, None where `rev` lacks it) is shared by the calls of one `tmp`."""

    def module(name: str) -> str | None:
        if name not in made:
            try:
                src = _show(rev, name)
            except subprocess.CalledProcessError:
                made[name] = None
                return None
            made[name] = f"rev_ops_{name.lstrip('_')}"  # named before its own imports are rewritten: cycles end here
            (tmp / f"{made[name]}.py").write_text(rewrite(src))
        return made[name]

    def rewrite(src: str) -> str:
        def sub(m: re.Match) -> str:
            name = m.group(1) or m.group(2)
            mod = module(name)
            if mod is None:
                return m.group(0)
            return f"from {mod} import" if m.group(1) else f"import {mod} as {name}"

        return OPS_IMPORT.sub(sub, src)

    if str(tmp) not in sys.path:
        sys.path.insert(0, str(tmp))
    return rewrite(_show(rev, op))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD", help="the revision to compare against (default HEAD)")
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args()
    lines = [f"sm_90 PTX of this tree against {args.rev} (PDL / PREFETCH at their defaults), and the PDL variants"]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        made: dict[str, str | None] = {}  # the imported modules at REV, each written once
        for op, kernel, const, types, opts in CASES:
            old = Path(tmp) / f"{op}.py"
            if not old.exists():
                old.write_text(at_rev(args.rev, op, Path(tmp), made))
            new = oc.op_path(op)
            a, b = ptx(new, kernel, const, types, opts), ptx(old, kernel, const, types, opts)
            ia, ib = instructions(a), instructions(b)
            moved = sum(x != y for x, y in zip(ia.splitlines(), ib.splitlines(), strict=False))
            renumbered = canonical(ia) == canonical(ib)
            same = a == b or ia == ib or renumbered or sorted(ia.splitlines()) == sorted(ib.splitlines())
            verdict = ("identical" if a == b else "identical but for its parameters" if ia == ib else
                       "identical but for register numbering" + ("" if canonical(a) == canonical(b) else
                                                                 " and its parameters") if renumbered else
                       f"the same instructions but for its parameters, {moved} lines in another order" if same
                       else "DIFFERENT")
            da, db = declared(a), declared(b)
            counts = ", ".join(f"%{c}<{da.get(c)}> here, <{db.get(c)}> at {args.rev}" for c in sorted({*da, *db})
                               if da.get(c) != db.get(c))
            verdict += f" (declared {counts})" if counts else ""
            flags = " ".join(k for k in ("ROPE", "ROPE_REGS") if const.get(k))  # rmsnorm's rope launches
            line = f"{op:12s} {(kernel + ' ' + flags).strip():32s} off: {verdict}"
            ok &= same
            if "PDL" not in oc.signature(oc.kernel(new, kernel), {}, {})[0]:  # a kernel never launched with PDL
                lines.append(line)
                print(line, flush=True)
                continue
            on = ptx(new, kernel, const, types, opts, {"PDL": True})
            waits = on.count("griddepcontrol.wait")
            line += f"   PDL on: {waits} wait"
            if kernel == "_linear_fwd_kernel":
                pf = ptx(new, kernel, const, types, opts, {"PDL": True, "PREFETCH": True})
                before = pf.find("prefetch.global.L2") < pf.find("griddepcontrol.wait")
                line += f", PREFETCH: {pf.count('prefetch.global.L2')} prefetches, first before the wait: {before}"
            ok &= waits == 1
            lines.append(line)
            print(line, flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
