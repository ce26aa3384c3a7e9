"""Inputs staged on the device once (`contract.Staged`), and the timing child's dry run of every cell
(`timing._dry_cells`, what it compiles ahead)."""

from __future__ import annotations

import torch

from tik_kernels.contract import Probe, Staged, execute_probe, same_bits
from tik_kernels.contracts import get_contract
from tik_kernels.evaluator import timing


class Mod:
    """An implementation that records the input it was given and can write into it."""

    def __init__(self, mutate: bool = False):
        self.seen, self.mutate = [], mutate

    def f(self, x, w):
        self.seen.append(x)
        if self.mutate:
            x.add_(1)
        return x @ w.T


def test_each_probe_gets_a_fresh_copy_of_a_shared_input_and_a_mutation_shows_against_the_master():
    w = torch.randn(5, 4)
    probes = [Probe(f"p{i}", "f", (torch.randn(3, 4), w), echo_inputs=True) for i in range(3)]
    staged, mod = Staged("cpu"), Mod()
    results = [execute_probe(mod, p, "cpu", staged=staged) for p in probes]
    assert all(r.error is None for r in results)
    # one master per distinct host tensor, never the tensor handed to a call; a new copy (address) per probe
    assert len(staged._masters) == 4 and staged.master(w) is staged.master(w)
    ptrs = {r.inputs_after[1].data_ptr() for r in results} | {staged.master(w).data_ptr(), w.data_ptr()}
    assert len(ptrs) == 5
    for p, r in zip(probes, results, strict=True):
        assert torch.equal(r.outputs[0], p.args[0] @ w.T)
        assert all(same_bits(a, staged.master(h)) for a, h in zip(r.inputs_after, p.args, strict=True))
    bad = Mod(mutate=True)
    r = execute_probe(bad, probes[0], "cpu", staged=staged)
    assert not same_bits(r.inputs_after[0], staged.master(probes[0].args[0]))
    assert same_bits(staged.master(probes[0].args[0]), probes[0].args[0]), "the master was written"
    staged.drop()
    assert not staged._masters


def test_the_dry_run_gives_a_call_the_strides_and_offsets_its_real_copies_have():
    """`call_probe(values=False)` (what compile-ahead records from) must hand the implementation tensors laid out as
    the real pass's copies are, or Triton is asked for other specialisations than the real launches will ask for:
    a copy keeps a dense tensor's strides and makes any other (expanded, sliced with gaps, offset) contiguous."""
    from tik_kernels.contract import call_probe

    inputs = [torch.randn(4, 6).t(), torch.randn(1, 6).expand(4, 6), torch.randn(8, 6)[::2], torch.randn(4, 7)[:, 1:],
              torch.randn(4, 6).to(torch.bfloat16)]
    seen = []

    class Record:
        def f(self, x):
            seen.append((tuple(x.shape), x.stride(), x.storage_offset(), x.dtype))
            return x.float().sum(1)

    for x in inputs:
        probe = Probe("p", "f", (x,))
        call_probe(Record(), probe, "cpu", values=False)
        call_probe(Record(), probe, "cpu", staged=Staged("cpu"))
        call_probe(Record(), probe, "cpu")
        assert seen[-3] == seen[-2] == seen[-1], (x.stride(), seen[-3:])


def test_the_timing_dry_run_calls_every_implementation_on_every_cell_and_its_rows_again_shapes():
    contract = get_contract("rmsnorm")
    cells = {c.name: c for c in contract.cells("cpu")}
    calls: dict[str, list] = {"root": [], "candidate": []}

    class Impl:
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail

        def rmsnorm(self, x, *args, **kwargs):
            calls[self.name].append(tuple(x.shape))
            if self.fail:
                raise RuntimeError("garbage in, garbage out")

    job = {"seed": 0, "variants": 2, "device": "cpu", "cells": list(cells)}
    dry = timing._dry_cells(contract, cells, {"candidate": Impl("candidate", fail=True), "root": Impl("root")}, job)
    assert len(dry) == len(cells)
    for d in dry:
        d()
    rows = [contract.bench_case(c, 0, "cpu").args[0].shape[0] for c in cells.values()]
    want = [s for T in rows for s in [T, *sorted({1, min(timing.ROWS_BATCH, T)} - {T})]]
    assert [s[0] for s in calls["root"]] == want
    # an implementation that raises is not called on that cell's other shapes, and the others still are
    assert len(calls["candidate"]) == len(cells)


def test_every_library_root_passes_the_source_screen():
    """A root whose text names the evaluator or the UI (a comment citing `tik_tui...` did) is refused before it runs,
    and a search from it never starts."""
    from tik_kernels.contracts import all_contracts
    from tik_kernels.evaluator.core import source_policy

    for op, contract in all_contracts().items():
        assert source_policy(contract.root_path.read_text()) is None, op
