"""Contract of `embedding(ids[T], table[V, H]) -> [T, H]`: a gather, and a deterministic table gradient.

Frozen. The table is bf16 N(0, 1); half of the ids come from a hot set of 8 ids, so the gradient check
sums many tokens into one table row (the reduction whose order must not vary), the rest are uniform
over the vocabulary.

Vocabulary in the plans: the GPU profile uses the models' hidden sizes with V = 8192, not 128k–152k:
every probe ships its inputs to the evaluator's child process and the float64 gradient reference is a
dense [V, H] tensor (152k × 4096 would be 2.5 GB per probe, 5 GB in float64). The kernel's logic does not
depend on V; the workload cells (timing) use the real vocabularies.

Tolerances: the forward output is a copy, so it must equal the float64 reference exactly (rel_rms 0,
max_abs 0). The table gradient sums each row's tokens in fp32 and rounds once to bf16 (measured rel_rms
≈ 2.2e-3); 1e-2 leaves margin and catches a dropped or doubled token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tik_kernels.contract import (
    GRADIENT_REQUIREMENT,
    TOKENWISE_REQUIREMENTS,
    BenchCase,
    Cell,
    Contract,
    Plan,
    TokenwiseConfig,
    Tolerance,
    tokenwise_plan,
)
from tik_kernels.contracts._common import with_grad_rerun
from tik_kernels.models import DECODE_BATCHES, MODELS, TRAIN_TOKENS
from tik_kernels.reference.embedding import embedding as embedding_ref

TOL = Tolerance(rel_rms=0.0, max_abs=0.0)
GRAD_TOL = Tolerance(rel_rms=1e-2)
GPU_VOCAB = 8192

CPU_SIZES = (1, 2, 3, 7, 12)
GPU_SIZES = (1, 2, 3, 7, 64, 255, 1024, 2048)


def _inputs(V: int, H: int, T: int, gen: torch.Generator, device: str = "cpu") -> tuple:
    hot = torch.randint(0, V, (8,), generator=gen, device=device)
    ids = torch.randint(0, V, (T,), generator=gen, device=device)
    pick = torch.rand(T, generator=gen, device=device) < 0.5
    ids = torch.where(pick, hot[torch.randint(0, 8, (T,), generator=gen, device=device)], ids)
    table = torch.randn((V, H), generator=gen, device=device).to(torch.bfloat16)
    return ids, table


def config(name: str, V: int, H: int) -> TokenwiseConfig:
    return TokenwiseConfig(
        name=name,
        make_inputs=lambda T, gen: _inputs(V, H, T, gen),
        token_args=(0,),
        reference=embedding_ref,
        tolerance=TOL,
        grad_args=(1,),
        grad_tolerance=GRAD_TOL,
    )


def configs(profile: str) -> list[TokenwiseConfig]:
    if profile == "cpu":
        # an odd width (a partial column block) and a vocabulary smaller than the batch (many repeats)
        return [config("vocab[V=50,H=40]", 50, 40), config("vocab[V=7,H=64]", 7, 64)]
    if profile == "gpu":
        widths = sorted({m.hidden for m in MODELS})
        return [config(f"vocab[V={GPU_VOCAB},H={h}]", GPU_VOCAB, h) for h in widths]
    raise ValueError(f"unknown profile {profile!r}")


def make_plan(cfgs: list[TokenwiseConfig], sizes: tuple[int, ...], seed: int) -> Plan:
    return with_grad_rerun(tokenwise_plan("embedding", cfgs, sizes, seed))


def build_plan(profile: str, seed: int) -> Plan:
    return make_plan(configs(profile), CPU_SIZES if profile == "cpu" else GPU_SIZES, seed)


def cells(profile: str) -> list[Cell]:
    """Decode batches and packed training micro-batches per model (V, H), coefficient 1.0 each (AReaL-TIK)."""
    if profile == "cpu":
        return [Cell(f"cpu/embedding[T={T},V=50,H=40]", {"T": T, "V": 50, "H": 40}) for T in (1, 16)]
    out, seen = [], set()
    for m in MODELS:
        if (m.vocab, m.hidden) in seen:
            continue
        seen.add((m.vocab, m.hidden))
        for T in DECODE_BATCHES + TRAIN_TOKENS:
            regime = "decode" if T in DECODE_BATCHES else "train"
            out.append(Cell(f"{m.name}/{regime}[T={T},V={m.vocab},H={m.hidden}]",
                            {"model": m.name, "T": T, "V": m.vocab, "H": m.hidden}))
    return out


def bench_case(cell: Cell, seed: int, device: str) -> BenchCase:
    T, V, H = cell.params["T"], cell.params["V"], cell.params["H"]
    ids, table = _inputs(V, H, T, torch.Generator(device).manual_seed(seed), device)
    return BenchCase(
        entry="embedding",
        args=(ids, table),
        baseline=lambda: F.embedding(ids, table),
        bytes_moved=2 * T * H * table.element_size() + ids.numel() * ids.element_size(),
        token_args=(0,),
    )


CONTRACT = Contract(
    op="embedding",
    entries=("embedding",),
    impl="tik_kernels.ops.embedding",
    summary="token embedding gather table[ids] -> [T, H] (exact copy); deterministic sorted-segment table gradient",
    requirements=TOKENWISE_REQUIREMENTS + (GRADIENT_REQUIREMENT,),
    tolerances={"forward": TOL, "gradient": GRAD_TOL},
    build_plan=build_plan,
    cells=cells,
    bench_case=bench_case,
)
