"""Bit comparisons and errors against a float64 reference: what every check is built from."""

from __future__ import annotations

import math

import torch

from tik_kernels.contract.model import Tolerance


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor as an integer tensor of the same element size."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    return t.contiguous().view(view)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and raw bits (NaN payloads, -0.0): `bitwise_equal` without the detail. Compared where both
    are when they are on one device, else on the CPU."""
    if a.device != b.device:
        a, b = a.cpu(), b.cpu()
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(_bits(a), _bits(b)))


def bitwise_equal(a: torch.Tensor, b: torch.Tensor, what: str = "") -> tuple[bool, str, float | None]:
    """Exact equality of raw bits (NaN payloads included). Returns (passed, detail, max_abs_diff)."""
    prefix = f"{what}: " if what else ""
    if a.shape != b.shape:
        return False, f"{prefix}shape {tuple(a.shape)} != {tuple(b.shape)}", None
    if a.dtype != b.dtype:
        return False, f"{prefix}dtype {a.dtype} != {b.dtype}", None
    ba, bb = _bits(a), _bits(b)
    if torch.equal(ba, bb):  # the common case, ~8x faster than counting (`ne().sum()` below) on the CPU
        return True, f"{prefix}{a.numel()} elements bitwise equal", 0.0
    neq = ba != bb
    n = int(neq.sum())
    diff = float((a.double() - b.double()).abs().nan_to_num(nan=math.inf).max()) if a.is_floating_point() else None
    where = neq.nonzero()[0].tolist()
    return False, f"{prefix}{n}/{a.numel()} elements differ (first at {where}, max |diff| {diff:.3g})", diff


def error_stats(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max-abs error, relative RMS error) of `out` against a float64 `ref`; (inf, inf) when `out` holds a NaN or an
    infinity (a NaN in `ref` alone gives NaN). Three reductions of one difference, read back together: a gradient of a
    weight is 10^8 elements, and separate `pow` / `mean` / `isfinite` passes took 4.4 of the 5.4 s of linear's checks
    on two cores. `evaluator.measure.rel_rms` is the same figure."""
    if not out.numel():
        return 0.0, 0.0
    d = out.to(torch.float64, copy=True).sub_(ref)  # a copy even when `out` is float64 already
    max_abs, num, den = torch.stack([torch.linalg.vector_norm(d, ord=math.inf), torch.linalg.vector_norm(d),
                                     torch.linalg.vector_norm(ref.double())]).tolist()
    if not math.isfinite(max_abs) and not bool(torch.isfinite(out).all()):
        return math.inf, math.inf
    return max_abs, num / max(den, 1e-30 * math.sqrt(d.numel()))


def accurate(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, what: str = "") -> tuple[bool, str, float]:
    """Accuracy against float64: relative RMS (and max-abs when stated) within `tol`; NaN never passes."""
    prefix = f"{what}: " if what else ""
    if out.shape != ref.shape:
        return False, f"{prefix}shape {tuple(out.shape)} != reference {tuple(ref.shape)}", math.inf
    max_abs, rel = error_stats(out, ref)
    ok = rel <= tol.rel_rms and (tol.max_abs is None or max_abs <= tol.max_abs)
    bound = f"rel_rms<={tol.rel_rms:g}" + (f", max_abs<={tol.max_abs:g}" if tol.max_abs is not None else "")
    return ok, f"{prefix}rel_rms {rel:.3g}, max_abs {max_abs:.3g} ({bound})", max_abs


def inputs_unchanged(after: list[torch.Tensor] | None, sent: tuple | list) -> tuple[bool, str]:
    """A probe's inputs as it echoed them back (`Results.inputs_after`) against the tensors of `sent`, bit for bit."""
    sent = [t for t in sent if isinstance(t, torch.Tensor)]
    after = after or []
    if len(after) != len(sent):
        return False, "inputs were not echoed"
    for k, (x, y) in enumerate(zip(after, sent, strict=True)):
        ok, detail, _ = bitwise_equal(x, y, f"input {k}")
        if not ok:
            return False, "input mutated: " + detail
    return True, f"{len(sent)} inputs bitwise unchanged"
