"""`tik ops`, `tik check`, `tik bench`: the operators, their contracts, and the trusted evaluator.

`tik check` exits 0 when the implementation is verified, 1 when it is not, 2 on a user error
(unknown operator, missing or malformed file, no GPU for --device cuda). `tik bench` times
every workload cell interleaved with the root and stock PyTorch; without a GPU it runs the
same harness in Triton's interpreter and marks the numbers as interpreter wall times, which
say nothing about GPU speed and are never compared with GPU ones.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tik_tui.cli.common import TikError, common_parent, positive_float, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ops", parents=[common_parent()], help="operators, their contracts and workload cells")
    p.set_defaults(func=cmd_ops)

    for name, text, fn in (("check", "run OP's contract on an implementation file", cmd_check),
                           ("bench", "latency per workload cell, beside the root and stock PyTorch", cmd_bench)):
        q = sub.add_parser(name, parents=[common_parent()], help=text)
        q.add_argument("op")
        q.add_argument("--impl", type=Path, default=None, metavar="FILE",
                       help="implementation file (default: the library's root)")
        q.add_argument("--device", choices=("cpu", "cuda"), default=None,
                       help="where to run (default: cuda when present)")
        q.add_argument("--timeout", type=positive_float, default=60.0, metavar="S",
                       help="hard limit per child process phase, seconds (default 60)")
        q.add_argument("--seed", type=int, default=0, help="seed of the contract's inputs (default 0)")
        q.add_argument("--unsafe-no-sandbox", action="store_true",
                       help="run the implementation in a plain child process where the kernel refuses the sandbox's "
                            "namespaces (it can then read and write whatever you can)")
        if name == "bench":
            q.add_argument("--incumbent", type=Path, default=None, metavar="FILE",
                           help="also time this implementation as the incumbent")
            q.add_argument("--no-chart", action="store_true", help="the table only, without the bar chart")
        q.set_defaults(func=fn)


def _contract(op: str):
    from tik_kernels.contracts import UnknownOperator, get_contract

    try:
        return get_contract(op)
    except UnknownOperator as e:
        raise TikError(str(e)) from None


def _source(path: Path, what: str = "implementation") -> Path:
    from tik_kernels.evaluator import source_problem

    if not path.exists():
        raise TikError(f"no such {what} file: {path}")
    if not path.is_file():
        raise TikError(f"{what} is not a file: {path}")
    problem, _ = source_problem(path)
    if problem:
        raise TikError(f"{path}: {problem}")
    return path


def _device(dev: str | None) -> str:
    import torch

    if dev == "cuda" and not torch.cuda.is_available():
        raise TikError("--device cuda: no CUDA GPU on this machine")
    return dev or ("cuda" if torch.cuda.is_available() else "cpu")


def _common(args: argparse.Namespace):
    if args.timeout <= 0:
        raise TikError("--timeout must be positive")
    contract = _contract(args.op)
    impl = _source(args.impl) if args.impl is not None else contract.root_path
    return contract, impl, _device(args.device)


def _sandbox(args: argparse.Namespace, *files: Path | None) -> bool | None:
    """evaluate()'s `sandbox`: False with --unsafe-no-sandbox; otherwise a file other than the library's root
    does not run where the sandbox cannot start (a one-line error before anything runs)."""
    if args.unsafe_no_sandbox:
        return False
    if any(f is not None for f in files):
        from tik_kernels.evaluator.sandbox import required

        problem = required()
        if problem:
            raise TikError(problem)
    return None


def cmd_ops(args: argparse.Namespace) -> int:
    from tik_kernels.contracts import all_contracts

    docs = []
    for c in all_contracts().values():
        d = c.describe()
        d["cells"] = {prof: [{"name": x.name, "params": dict(x.params), "coeff": x.coeff, "limit": x.limit}
                             for x in c.cells(prof)] for prof in ("cpu", "gpu")}
        docs.append(d)
    if args.json:
        print_json(docs)
        return 0
    for d in docs:
        print(f"{d['op']:<12} {', '.join(d['entries'])}  ({len(d['cells']['gpu'])} GPU cells, "
              f"{len(d['cells']['cpu'])} CPU cells)")
        print(f"  {d['summary']}")
        print(f"  requires: {', '.join(r['name'] for r in d['requirements'])}"
              + ("; root bits preserved" if d["preserve_root_bits"] else ""))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from tik_kernels.evaluator import evaluate

    contract, impl, device = _common(args)
    sandbox = _sandbox(args, args.impl)
    rep = evaluate(contract, impl, device=device, timeout=args.timeout, time_it=False, seed=args.seed,
                   sandbox=sandbox)
    doc = rep.as_dict()
    doc["impl"] = str(impl)
    if args.json:
        print_json(doc)
    else:
        print(f"{contract.op}: {impl} on {device} (profile {rep.profile}, seed {rep.seed})")
        for c in doc["checks"]:
            print(f"  {'PASS' if c['passed'] else 'FAIL'}  {c['name']}  {c['detail']}")
        print(_verdict(doc))
    return 0 if rep.verified else 1


def _verdict(doc: dict) -> str:
    n = len(doc["checks"])
    if doc["verified"]:
        return f"verified ({n} checks, {doc['elapsed_s']:.1f} s)"
    return f"NOT verified: {doc['failure']}"


def _us(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.2f} ms" if v >= 10_000 else f"{v:.1f} us"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}×"


def cmd_bench(args: argparse.Namespace) -> int:
    from tik_kernels.evaluator import evaluate

    contract, impl, device = _common(args)
    incumbent = _source(args.incumbent, "incumbent") if args.incumbent is not None else None
    sandbox = _sandbox(args, args.impl, incumbent)
    interp = not device.startswith("cuda")
    if interp:
        print("tik bench: no GPU: these are Triton-interpreter wall times on the CPU, not GPU timings "
              "(never compare them with GPU numbers)", file=sys.stderr)
    from tik_kernels.evaluator.spares import PRESTART_ENV
    from tik_tui.cli.charts import progress

    # one evaluation, no next candidate: a pre-started child would start, take a CPU (and a CUDA context) and be
    # thrown away (a TIK_PRESTART the user set is kept)
    os.environ.setdefault(PRESTART_ENV, "0")
    with progress(f"tik bench: checking and timing {contract.op} on {device}"):
        rep = evaluate(contract, impl, incumbent_path=incumbent, device=device, timeout=args.timeout, time_it=True,
                       seed=args.seed, sandbox=sandbox)
    doc = rep.as_dict()
    doc["impl"] = str(impl)
    if interp:
        doc["note"] = "Triton-interpreter wall times on the CPU: not GPU timings"
    if args.json:
        print_json(doc)
        return 0 if rep.verified else 1
    print(f"{contract.op}: {impl} on {device} ({'INTERPRETER wall times' if interp else 'GPU, CUDA events'}, "
          f"medians of {doc['cells'][0]['samples'] if doc['cells'] else 0} interleaved samples)")
    if not rep.verified:
        print(_verdict(doc))
        return 1
    cols = ("cell", "median", "spread", "root", "×root", "torch", "×torch")
    rows = [(c["cell"], _us(c["median_us"]), _us(c["spread_us"]), _us(c["root_median_us"]), _x(c["ratio_vs_root"]),
             _us(c["baseline_median_us"]), _x(c["ratio_vs_baseline"])) for c in doc["cells"]]
    width = [max(len(r[i]) for r in [cols, *rows]) for i in range(len(cols))]
    for r in [cols, *rows]:
        print("  ".join(s.ljust(w) if i == 0 else s.rjust(w) for i, (s, w) in enumerate(zip(r, width, strict=True))))
    print(f"objective {_us(doc['objective'])} (incumbent {_us(doc['incumbent_objective'])}); "
          f"admissible {doc['admissible']}, eligible {doc['eligible']}" + ("  [interpreter]" if interp else ""))
    if not args.no_chart:
        from tik_tui.cli.charts import ratio_bars
        from tik_tui.verdict import cell_limit

        print("\ntime ×root per cell (a bar left of │ is faster, right slower; ┊ is the cell's limit):")
        label_w = min(44, max(len(str(c["cell"])) for c in doc["cells"]))
        for line in ratio_bars([(str(c["cell"]), c["ratio_vs_root"], cell_limit(c)) for c in doc["cells"]],
                               label_w=label_w):
            print(line)
    return 0
