"""Where a decode step's time goes: every kernel call of one step, timed alone, against its own floor (H200).

    PYTHONPATH=. python benchmarks/decode_breakdown.py --out benchmarks/results            # qwen3-0.6b, B=64, L=256
    PYTHONPATH=. python benchmarks/decode_breakdown.py --device cpu --layers 1 --batch 2 --context 8 --out /tmp/x

`bench_e2e.py --only decode` times a whole decode step against the bandwidth floor (weights + KV at 4.2 TB/s).
This splits it: one step of the rollout engine's decode (the model's `forward_decode`, then the engine's
`sample_logprob` on the last hidden state, the sampler and its log-prob in one pass) runs once through a backend
that records every call; calls of
one operator with the same shapes (the layers repeat them) are grouped, and each group's call is timed with the
benchmark harness (a CUDA graph of back-to-back calls on rotating copies of its inputs, so weights and KV come
from HBM, medians over rounds) and multiplied by its count. Beside each: the bytes its tensors cover (inputs and
output) and that over 4.2 TB/s, so a call far above its own floor stands out. The rest of the step (cache writes
and the glue between calls, which do not go through the backend, and the gaps between kernels) is the
difference to the step's graph replay, timed in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tik_kernels  # noqa: E402,F401  (before triton)
from benchmarks import harness as H  # noqa: E402
from tik_kernels.e2e.backends import make_backend  # noqa: E402
from tik_kernels.e2e.decode_bench import time_decode  # noqa: E402
from tik_kernels.e2e.model import PRESETS, KVCache, forward_decode, init_params  # noqa: E402
from tik_kernels.e2e.rollout import rollout_weights, token_seeds  # noqa: E402


class Recorder:
    """A backend that records each public call (name, args) and passes it on."""

    def __init__(self, be):
        self._be = be
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name):
        attr = getattr(self._be, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args):
            self.calls.append((name, args))
            return attr(*args)

        return call


def signature(name: str, args: tuple) -> tuple:
    """What makes two calls the same work: the operator, and each argument's shape/dtype (or value)."""
    return (name,) + tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


def record_step(mc, be, W, cache, batch: int, context: int, temperature: float = 1.0) -> list[tuple[str, tuple]]:
    """One decode step's backend calls, as the rollout engine makes them (forward, then the sample and its log-prob)."""
    rec = Recorder(be)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, mc.vocab, (batch,), generator=g).to(cache.k.device)
    pos = torch.full((batch,), context - 1, device=cache.k.device)
    seeds = torch.tensor(token_seeds(list(range(batch)), [context - 1] * batch), device=cache.k.device)
    with torch.no_grad():
        hidden = forward_decode(mc, rec, W, ids, pos, cache, kv_len=context)
        rec.sample_logprob(hidden, W["lm_head"], temperature, seeds)
    return rec.calls


def top_kernels(fn, args: tuple, n: int, calls: int = 3, device: str = "cuda") -> list[dict]:
    """The `n` kernels (CUDA) or ops (CPU) that took the most time over `calls` calls of fn(*args), under
    torch.profiler: [{"name", "us_per_call", "count"}], most time first. What a call's time is made of, where the
    call's own time is a surprise (mode A's lm_head: 4.9 ms inside the decode step, 0.3 ms timed alone)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    with torch.no_grad():
        fn(*args)  # compiled and warm before the profiled calls
        if cuda:
            torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            for _ in range(calls):
                fn(*args)
            if cuda:
                torch.cuda.synchronize()
    want = DeviceType.CUDA if cuda else DeviceType.CPU
    per: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == want and (cuda or e.cpu_parent is None):  # kernels; on the CPU, top-level ops
            per.setdefault(e.name, []).append(e.time_range.elapsed_us())
    rows = [{"name": k[:120], "us_per_call": sum(v) / calls, "count": len(v) / calls} for k, v in per.items()]
    return sorted(rows, key=lambda r: -r["us_per_call"])[:n]


def breakdown(mc, backend_name: str, batch: int, context: int, device: str, rounds: int, params,
              stock_compiled: bool = False, kernels: int = 0) -> dict:
    be = make_backend(backend_name, stock_compiled=stock_compiled)
    W = rollout_weights(params)  # as the rollout engine holds them
    cache = KVCache(mc, batch, context, device)
    gen = torch.Generator(device=device).manual_seed(0)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    calls = record_step(mc, be, W, cache, batch, context)
    groups: dict[tuple, dict] = {}
    for name, args in calls:
        key = signature(name, args)
        if key not in groups:
            shapes = [list(a.shape) for a in args if isinstance(a, torch.Tensor)]
            groups[key] = {"op": name, "shapes": shapes, "count": 0, "args": args}
        groups[key]["count"] += 1
    rows = []
    for g in groups.values():
        fn = getattr(be, g["op"])
        args = g.pop("args")
        with torch.no_grad():
            out = fn(*args)
        nbytes = H.tensor_bytes(args) + H.tensor_bytes(out)
        if g["op"] == "rope_cache":
            # the caches (args 5 and 6) are written at one row per token, not read: count those rows, not the caches
            k_cache, v_cache = args[5], args[6]
            nbytes -= H.tensor_bytes((k_cache, v_cache))
            nbytes += H.tensor_bytes((args[1], args[2]))
        if device == "cuda":
            r = H.compare({"call": lambda *a, fn=fn: fn(*a)}, args, rounds=rounds, nbytes=nbytes)["contenders"]["call"]
            us = r.get("median_us")
            g["error"] = r.get("error")
        else:
            us = None
        if kernels:
            g["kernels"] = top_kernels(fn, args, kernels, device=device)
        floor_us = nbytes / (H.COPY_TBPS * 1e12) * 1e6
        rows.append(g | {"bytes": nbytes, "floor_us": floor_us, "us": us,
                         "total_us": us * g["count"] if us is not None else None,
                         "over_floor": us / floor_us if us else None})
    rows.sort(key=lambda r: -(r["total_us"] or 0))
    total = sum(r["total_us"] or 0 for r in rows)
    return {"backend": backend_name, "calls": len(calls), "distinct": len(rows), "sum_of_calls_us": total,
            "rows": rows}


def write_md(doc: dict, path: Path) -> None:
    lines = [f"# A decode step, call by call ({doc['env'].get('gpu', doc['device'])})", "",
             f"`{doc['command']}`  ", f"{doc['preset']}, {doc['layers'] or 'all'} layers, B={doc['batch']}, "
             f"context {doc['context']}; each distinct call timed alone (CUDA graph of back-to-back calls on rotating "
             "input copies, medians), times its count. Floor: the bytes its tensors cover at 4.2 TB/s.", ""]
    for b in doc["backends"]:
        step = b.get("step", {})
        lines += [f"## {b['backend']}", "",
                  f"{b['calls']} backend calls ({b['distinct']} distinct): sum **{b['sum_of_calls_us']:.0f} µs**; "
                  f"the step's graph replay {step.get('replay_ms', float('nan')) * 1e3:.0f} µs, its floor "
                  f"{step.get('floor_ms', float('nan')) * 1e3:.0f} µs (the rest of the replay: cache writes, glue "
                  "and gaps between kernels)", "",
                  "| op | shapes | count | µs each | µs total | floor µs each | × floor |",
                  "|---|---|---|---|---|---|---|"]
        for r in b["rows"]:
            us = "-" if r["us"] is None else f"{r['us']:.1f}"
            tot = "-" if r["total_us"] is None else f"{r['total_us']:.0f}"
            of = "-" if r["over_floor"] is None else f"{r['over_floor']:.1f}"
            lines.append(f"| {r['op']} | {r['shapes']} | {r['count']} | {us} | {tot} | {r['floor_us']:.2f} | {of} |")
        lines.append("")
        profiled = [r for r in b["rows"] if r.get("kernels")]
        if profiled:
            lines += ["What each call runs (torch.profiler, `--kernels`: the kernels that took the most time, µs per "
                      "call, eager calls):", ""]
            for r in profiled:
                lines.append(f"- {r['op']} {r['shapes']}: " + "; ".join(
                    f"`{k['name'][:80]}` {k['us_per_call']:.1f} µs" + (f" ×{k['count']:g}" if k["count"] != 1 else "")
                    for k in r["kernels"]))
            lines.append("")
    path.write_text("\n".join(lines))


def apply_overrides(specs: list[str]) -> dict:
    """OP.KEY=VALUE (integers) into tik_kernels.ops.OP.CONFIG; a key the root does not have is an error."""
    import importlib

    done = {}
    for spec in specs:
        try:
            target, value = spec.split("=", 1)
            op, key = target.split(".", 1)
            value = int(value)
        except ValueError:
            raise ValueError(f"--set takes OP.KEY=INTEGER, got {spec!r}") from None
        try:
            mod = importlib.import_module(f"tik_kernels.ops.{op}")
        except ModuleNotFoundError:
            raise ValueError(f"--set {spec}: no operator {op!r}") from None
        if key not in mod.CONFIG:
            raise ValueError(f"--set {spec}: {op} has no tunable {key!r}")
        mod.CONFIG[key] = value
        done[f"{op}.{key}"] = value
    return done


def main(argv: list[str] | None = None) -> int:
    from tik_tui.cli.common import nonneg_int

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--preset", default="qwen3-0.6b", choices=list(PRESETS))
    ap.add_argument("--layers", type=int, default=None, help="cut the model to N layers (default: full depth)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--backends", nargs="+", default=["stock", "unified"], choices=["stock", "unified"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--set", action="append", default=[], metavar="OP.KEY=VALUE",
                    help="launch tunable of a library root for this run, e.g. attention.decode_num_stages=1 "
                         "(repeatable; only keys that change no bits make a fair comparison)")
    ap.add_argument("--name", default="", help="suffix of the output files (to keep runs with --set apart)")
    ap.add_argument("--kernels", type=nonneg_int, default=0, metavar="N",
                    help="also profile each distinct call and list the N kernels that took the most time")
    ap.add_argument("--stock-eager", action="store_true",
                    help="the stock backend's norms, rope and softmax rows as eager chains (default on cuda: compiled)")
    args = ap.parse_args(argv)
    try:
        overrides = apply_overrides(args.set)
    except ValueError as e:
        print(f"decode_breakdown: {e}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("decode_breakdown: no CUDA GPU here (--device cpu runs the code path; no times)", file=sys.stderr)
        return 2
    mc = PRESETS[args.preset]
    if args.layers:
        mc = mc.with_layers(args.layers)
    params = init_params(mc, 0, args.device)
    doc = {"command": H.command_line(), "env": H.environment(), "device": args.device, "preset": args.preset,
           "layers": args.layers, "batch": args.batch, "context": args.context, "overrides": overrides,
           "backends": []}
    for name in args.backends:
        # the stock backend as mode A runs it on CUDA (its compositions through torch.compile) unless --stock-eager
        compiled = args.device == "cuda" and not args.stock_eager
        b = breakdown(mc, name, args.batch, args.context, args.device, args.rounds, params, stock_compiled=compiled,
                      kernels=args.kernels)
        b["stock_compiled"] = compiled if name == "stock" else None
        if args.device == "cuda":
            step = time_decode(mc, make_backend(name, stock_compiled=compiled), batch=args.batch, context=args.context,
                               graphs=True, device=args.device, tbps=H.COPY_TBPS, params=params)
            b["step"] = {k: step.get(k) for k in ("step_ms", "replay_ms", "floor_ms", "replay_over_floor")}
        doc["backends"].append(b)
        print(json.dumps({"backend": name, "sum_of_calls_us": b["sum_of_calls_us"], **b.get("step", {})}), flush=True)
        for r in b["rows"][:12]:
            print(f"  {r['op']:16s} x{r['count']:<3d} {r['shapes']}  us {r['us']}  floor {r['floor_us']:.2f}",
                  flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"decode_breakdown_{H.card_tag(args.device)}_{args.preset}{args.name}"
    (args.out / f"{stem}.json").write_text(json.dumps(doc, indent=1, default=str))
    write_md(doc, args.out / f"{stem}.md")
    print(f"wrote {args.out / stem}.json and .md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
