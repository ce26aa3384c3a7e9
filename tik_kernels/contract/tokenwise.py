"""The standard plan of a token-wise operator (a token's result depends only on that token's row)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tik_kernels.contract.compare import accurate, bitwise_equal, inputs_unchanged
from tik_kernels.contract.model import Plan, Probe, Requirement, Results, Tolerance
from tik_kernels.contract.runner import flatten_outputs


@dataclass
class TokenwiseConfig:
    """One input configuration of a token-wise operator (e.g. one model's hidden size).

    `make_inputs(T, gen)` returns the positional arguments for T tokens, built on the CPU from
    `gen`; `token_args` are the positions whose dim 0 is the token dim (the rest are shared,
    e.g. weights). `reference(*args)` gets the same arguments upcast to float64 (integer
    tensors unchanged) and returns the float64 outputs. `grad_args` are positions that get
    gradients (checked against autograd through `reference`).
    """

    name: str
    make_inputs: Callable[[int, torch.Generator], tuple]
    token_args: tuple[int, ...]
    reference: Callable[..., Any] | None = None
    tolerance: Tolerance | None = None
    grad_args: tuple[int, ...] = ()
    grad_tolerance: Tolerance | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def gather_rows(args: tuple, token_args: Sequence[int], idx: torch.Tensor) -> tuple:
    return tuple(a[idx] if i in token_args else a for i, a in enumerate(args))


def cat_rows(parts: Sequence[tuple], token_args: Sequence[int]) -> tuple:
    first = parts[0]
    return tuple(torch.cat([p[i] for p in parts]) if i in token_args else first[i] for i in range(len(first)))


def upcast64(args: tuple) -> tuple:
    return tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def reference_outputs(cfg: TokenwiseConfig, args: tuple) -> list[torch.Tensor]:
    return flatten_outputs(cfg.reference(*upcast64(args)))


def reference_grads(cfg: TokenwiseConfig, args: tuple, grad_outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    a64 = list(upcast64(args))
    for i in cfg.grad_args:
        a64[i] = a64[i].detach().clone().requires_grad_(True)
    outs = flatten_outputs(cfg.reference(*a64))
    pairs = [(o, g.double()) for o, g in zip(outs, grad_outputs, strict=False) if g is not None]
    torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return [a64[i].grad for i in cfg.grad_args]


def _all_accurate(pairs: Sequence[tuple[torch.Tensor, torch.Tensor, str]], tol: Tolerance) -> tuple:
    """(ok, detail, worst error) of (got, float64 reference, label) pairs: the first that misses `tol`, else all
    details joined and the worst error."""
    worst, details = 0.0, []
    for got, ref, what in pairs:
        ok, detail, d = accurate(got, ref, tol, what)
        if not ok:
            return False, detail, d
        worst, details = max(worst, d), details + [detail]
    return True, "; ".join(details), worst


def tokenwise_plan(
    entry: str,
    configs: Sequence[TokenwiseConfig],
    sizes: Sequence[int],
    seed: int,
    *,
    preserve_root_bits: bool = False,
) -> Plan:
    """The standard plan of an operator whose result for a token depends only on that token's row.

    For each config: a full batch of T = max(sizes) rows; subsets of every size in `sizes`
    drawn in random order; the full batch permuted; rows repeated; two sequences packed
    back to back vs the same sequences padded with unrelated rows; a rerun (determinism);
    inputs unchanged; accuracy of the full batch against float64; gradients against float64.
    Each subset's output rows must equal the full batch's rows, raw bits.
    Requirement names used: batch_invariance, determinism, inputs_unchanged, accuracy, gradient,
    and root_bits when `preserve_root_bits`.
    """
    plan = Plan(needs_root=preserve_root_bits)
    rng = random.Random(seed)
    for cfg in configs:
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        T = max(sizes)
        pool = cfg.make_inputs(2 * T, gen)
        full = gather_rows(pool, cfg.token_args, torch.arange(T))
        extra = gather_rows(pool, cfg.token_args, torch.arange(T, 2 * T))
        p = f"{cfg.name}/"
        full_id = plan.add(Probe(p + f"full[T={T}]", entry, full, dict(cfg.kwargs), echo_inputs=True))
        again = plan.add(Probe(p + "rerun", entry, full, dict(cfg.kwargs)))

        def rows_equal(sub_id: str, idx: torch.Tensor, label: str, full_id: str = full_id, p: str = p) -> None:
            def fn(res: Results) -> tuple:
                sub, ref = res[sub_id], res[full_id]
                if len(sub) != len(ref):
                    return False, f"{len(sub)} outputs, expected {len(ref)}"
                worst = 0.0
                for k, (s, r) in enumerate(zip(sub, ref, strict=True)):
                    ok, detail, d = bitwise_equal(s, r[idx], f"output {k}")
                    if not ok:
                        return False, detail, d
                    worst = max(worst, d or 0.0)
                return True, f"{len(idx)} rows bitwise equal to the full batch's", worst

            plan.check(p + label, "batch_invariance", fn)

        for n in sorted(set(sizes)):
            if n == T:
                continue
            idx = torch.randperm(T, generator=gen)[:n]
            sid = plan.add(Probe(p + f"subset[T={n}]", entry, gather_rows(full, cfg.token_args, idx), dict(cfg.kwargs)))
            rows_equal(sid, idx, f"batch_invariance[T={n}]")
        perm = torch.randperm(T, generator=gen)
        sid = plan.add(Probe(p + "permuted", entry, gather_rows(full, cfg.token_args, perm), dict(cfg.kwargs)))
        rows_equal(sid, perm, "batch_invariance[permuted]")
        rep = torch.randint(0, T, (T,), generator=gen)
        sid = plan.add(Probe(p + "repeated", entry, gather_rows(full, cfg.token_args, rep), dict(cfg.kwargs)))
        rows_equal(sid, rep, "batch_invariance[repeated rows]")

        # packed: sequences A and B back to back (rows 0..a+b of full); padded: each followed by pad rows
        a = max(1, T // 3)
        b = max(1, T - a - max(1, T // 4))
        pad = max(1, T - a - b)
        padded = cat_rows(
            [
                gather_rows(full, cfg.token_args, torch.arange(0, a)),
                gather_rows(extra, cfg.token_args, torch.arange(0, pad)),
                gather_rows(full, cfg.token_args, torch.arange(a, a + b)),
                gather_rows(extra, cfg.token_args, torch.arange(pad, 2 * pad)),
            ],
            cfg.token_args,
        )
        sid = plan.add(Probe(p + "padded", entry, padded, dict(cfg.kwargs)))
        pos = torch.cat([torch.arange(0, a), torch.arange(a + pad, a + pad + b)])

        def packed_vs_padded(res: Results, sid: str = sid, pos: torch.Tensor = pos, full_id: str = full_id, a=a, b=b):
            n = a + b
            for k, (s, r) in enumerate(zip(res[sid], res[full_id], strict=True)):
                ok, detail, d = bitwise_equal(s[pos], r[:n], f"output {k}")
                if not ok:
                    return False, detail, d
            return True, f"packed rows ({a}+{b}) bitwise equal to padded rows", 0.0

        plan.check(p + "packed_vs_padded", "batch_invariance", packed_vs_padded)

        def determinism(res: Results, again: str = again, full_id: str = full_id):
            for k, (x, y) in enumerate(zip(res[again], res[full_id], strict=True)):
                ok, detail, d = bitwise_equal(x, y, f"output {k}")
                if not ok:
                    return False, "rerun differs: " + detail, d
            return True, "rerun bitwise identical", 0.0

        plan.check(p + "determinism", "determinism", determinism)

        def unchanged(res: Results, full: tuple = full, full_id: str = full_id):
            return inputs_unchanged(res.inputs_after(full_id), full)

        plan.check(p + "inputs_unchanged", "inputs_unchanged", unchanged)

        if cfg.reference is not None and cfg.tolerance is not None:
            refs = reference_outputs(cfg, full)

            def accuracy(res: Results, refs=refs, tol=cfg.tolerance, full_id: str = full_id):
                outs = res[full_id]
                if len(outs) != len(refs):
                    return False, f"{len(outs)} outputs, reference has {len(refs)}"
                pairs = [(o, r, f"output {k}") for k, (o, r) in enumerate(zip(outs, refs, strict=True))]
                return _all_accurate(pairs, tol)

            plan.check(p + "accuracy", "accuracy", accuracy)

        if cfg.grad_args and cfg.reference is not None:
            ref_outs = reference_outputs(cfg, full)
            gos = tuple(torch.randn(o.shape, generator=gen, dtype=torch.float32) for o in ref_outs)
            probe_gos = tuple(g.to(full[cfg.token_args[0]].dtype) if full[cfg.token_args[0]].is_floating_point()
                              else g for g in gos)
            gid = plan.add(Probe(p + "backward", entry, full, dict(cfg.kwargs), grad_args=cfg.grad_args,
                                 grad_outputs=probe_gos))
            ref_g = reference_grads(cfg, full, [g.double() for g in probe_gos])
            gtol = cfg.grad_tolerance or cfg.tolerance
            n_out = len(ref_outs)

            def gradient(res: Results, gid=gid, ref_g=ref_g, gtol=gtol, n_out=n_out, grad_args=cfg.grad_args):
                got = res[gid][n_out:]
                if len(got) != len(ref_g):
                    return False, f"{len(got)} gradients, expected {len(ref_g)}"
                pairs = [(g, r, f"grad of arg {i}") for i, g, r in zip(grad_args, got, ref_g, strict=True)]
                return _all_accurate(pairs, gtol)

            plan.check(p + "gradient", "gradient", gradient)

        if preserve_root_bits:

            def root_bits(res: Results, full_id: str = full_id):
                for k, (x, y) in enumerate(zip(res[full_id], res.root(full_id), strict=True)):
                    ok, detail, d = bitwise_equal(x, y, f"output {k}")
                    if not ok:
                        return False, "differs from root: " + detail, d
                return True, "bitwise equal to the root implementation", 0.0

            plan.check(p + "root_bits", "root_bits", root_bits)
    return plan


#: the requirements every token-wise plan checks
TOKENWISE_REQUIREMENTS = (
    Requirement("batch_invariance", "bitwise",
                "a token's result has the same bits whatever the other tokens: any T, order, repetition, packing"),
    Requirement("determinism", "determinism", "a rerun on the same inputs gives the same bits"),
    Requirement("inputs_unchanged", "inputs_unchanged", "the call leaves every input bitwise unchanged"),
    Requirement("accuracy", "accuracy", "within the stated tolerance of a float64 reference"),
)
GRADIENT_REQUIREMENT = Requirement("gradient", "gradient", "gradients within tolerance of float64 autograd")
ROOT_BITS_REQUIREMENT = Requirement("root_bits", "root_bits", "outputs bitwise equal to the frozen root's")
