"""One operator kernel compiled for sm_90 on a machine without a GPU: the signature a launch would give it.

The offline tools (`attn_ir_offline.py`, `lmhead_ptx_offline.py`, `ptx_unchanged.py`, `fma_offline.py`) all compile
through `compile_sm90`, so they agree on what a case means: the constexprs it sets, every other constexpr parameter at
its default (else Triton would compile it as a runtime int), the argument types it names, and the rest typed by name
(`default_type`). A real launch also specializes its arguments: pointers 16-byte aligned, integers divisible by 16
where they are. `aligned` names the integers a case takes as such; without it no bf16 load is vectorized or pipelined,
and the registers, spills and async copies read from the result are not the GPU's. Importing this module turns the
interpreter off (before anything imports Triton): the kernels must be JITFunctions to compile.

Run the tools with the GPU's Triton first on the path (`PYTHONPATH=<a pip --target dir of triton==3.6.0>:.`) to see
what the GPU would run; this machine's own Triton may be another version.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # the real compiler: kernels are JITFunctions, not interpreted
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

F32, I32, I64 = "*fp32", "*i32", "*i64"
#: an SM of an H100 or H200 (sm_90): registers, the shared memory its blocks may take together (bytes), threads, blocks
SM_REGS, SM_SHARED, SM_THREADS, SM_BLOCKS = 65536, 233472, 2048, 32


def programs_per_sm(regs: int, shared: int, warps: int) -> dict:
    """How many programs of a kernel an sm_90 SM holds at once, by each limit: registers (allocated 8 a thread at a
    time), shared memory (1 KB reserved a block), threads and blocks; `min` of them is the answer."""
    return {"registers": SM_REGS // max(1, (regs + 7) // 8 * 8 * 32 * warps),
            "shared": SM_SHARED // (shared + 1024), "threads": SM_THREADS // (32 * warps), "blocks": SM_BLOCKS}


def op_path(op: str) -> Path:
    """This tree's file of operator `op`."""
    return ROOT / "tik_kernels" / "ops" / f"{op}.py"


def kernel(path: Path, name: str):
    """Kernel `name` of the operator file at `path` (any copy: a revision's, a candidate's), loaded on its own."""
    from tik_kernels.contract import load_module

    return getattr(load_module(path, f"offline_{abs(hash((str(path), name)))}"), name)


def bf16_pointers(name: str) -> str:
    """The usual type of an argument not named in a case: a bf16 pointer for `*_ptr` / `*_desc`, else an i32."""
    return "*bf16" if name.endswith(("_ptr", "_desc")) else "i32"


def signature(fn, const: dict, types: dict, default_type: Callable[[str], str] = bf16_pointers) -> tuple[dict, dict]:
    """(constexprs, signature) of JITFunction `fn`: the case's constexprs that are parameters of `fn` (a case may
    name ones an older revision lacks), every other constexpr parameter at its default, then each argument's type
    from `types`, else `default_type(name)`."""
    params = inspect.signature(fn.fn).parameters
    c = {n: v for n, v in const.items() if n in params}
    for n, p in params.items():
        if n not in c and "constexpr" in str(p.annotation) and p.default is not inspect.Parameter.empty:
            c[n] = p.default
    sig = {n: "constexpr" if n in c else types.get(n) or default_type(n) for n in params}
    return c, sig


def specialized(sig: dict, aligned: Iterable[str]) -> dict:
    """The divisibility attributes of a launch: every pointer 16-byte aligned, and the integers in `aligned`
    divisible by 16."""
    aligned = set(aligned)
    return {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
            if t.startswith("*") or (t == "i32" and n in aligned)}


def compile_sm90(fn, const: dict, types: dict, options: dict, *, default_type: Callable[[str], str] = bf16_pointers,
                 aligned: Iterable[str] | None = None):
    """`fn` (a Triton or a Gluon kernel) compiled for sm_90 with these constexprs, argument types and compile options
    (num_warps, num_stages, enable_fp_fusion, launch_pdl, ...). `aligned`: None compiles it unspecialized (all
    pointers and integers arbitrary: fine for comparing two versions compiled alike); else the integers a launch finds
    divisible by 16, pointers aligned (`specialized`)."""
    import triton
    from triton.backends.compiler import GPUTarget

    c, sig = signature(fn, const, types, default_type)
    attrs = specialized(sig, aligned) if aligned is not None else {}
    source = triton.compiler.ASTSource
    if getattr(fn, "is_gluon", lambda: False)():  # a Gluon kernel (triton.experimental.gluon.jit): its own front end
        from triton.experimental.gluon._runtime import GluonASTSource as source
    return triton.compile(source(fn=fn, signature=sig, constexprs=c, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)


def plain_ptx(text: str) -> str:
    """PTX without source line markers, comments, debug sections and the labels only they refer to (`$L__tmpN`:
    inlined helpers' scopes, which move with the file's lines and its helper calls)."""
    text = text[: text.find(".section\t.debug")] if ".section\t.debug" in text else text
    return "\n".join(line.split("//")[0].rstrip() for line in text.splitlines()
                     if not line.strip().startswith((".loc", ".file", "//"))
                     and not re.fullmatch(r"\$L__tmp\d+:", line.strip()))


def tool(name: str) -> Path:
    """One of the CUDA tools Triton ships (ptxas, nvdisasm, ...), where it keeps them."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def ptxases(arch: str) -> list[str]:
    """The ptxas Triton itself runs for `arch` (sm_90: the plain one; ptxas-blackwell from sm_100 on), then the
    other: this machine's Triton may write PTX newer than the plain one takes."""
    names = ["ptxas", "ptxas-blackwell"]
    if int(re.sub(r"\D", "", arch)) >= 100:
        names.reverse()
    return [str(tool(n)) for n in names if tool(n).exists()] or ["ptxas"]


def ptxas_version(arch: str = "sm_90") -> str:
    """The version line of the ptxas Triton runs for `arch`."""
    out = subprocess.run([ptxases(arch)[0], "--version"], capture_output=True, text=True).stdout
    return f"{Path(ptxases(arch)[0]).name}: {out.strip().splitlines()[-1]}"


def assemble(ptx: str, cubin: Path | None = None) -> str:
    """ptxas's verbose report (registers, spills, warnings such as C7515) of `ptx` assembled for its target
    (sm_90a for sm_90: wgmma needs the architecture-specific target), by the first of `ptxases` that takes this
    PTX; the cubin is written to `cubin` when given."""
    arch = re.search(r"\.target (sm_\w+)", ptx).group(1)
    arch += "a" if arch == "sm_90" else ""
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "k.ptx", cubin or Path(d) / "k.cubin"
        src.write_text(ptx)
        for exe in ptxases(arch):
            run = subprocess.run([exe, "-v", f"--gpu-name={arch}", str(src), "-o", str(out)],
                                 capture_output=True, text=True)
            if run.returncode == 0:
                return run.stderr
        raise RuntimeError(f"ptxas failed on {arch}: {(run.stderr.strip().splitlines() or ['?'])[-1]}")


def disassemble(cubin: Path) -> str | None:
    """The SASS of a cubin (nvdisasm), or None where Triton ships no nvdisasm."""
    if not tool("nvdisasm").exists():
        return None
    return subprocess.run([str(tool("nvdisasm")), "-c", str(cubin)], capture_output=True, text=True).stdout


def sass(ptx: str) -> str | None:
    """The SASS of `ptx` (`assemble`, then `disassemble`), or None where Triton ships no nvdisasm."""
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        assemble(ptx, cubin)
        return disassemble(cubin)
