"""The decode step's lm_head: sample_logprob (the token and its log-prob in one pass) against logprob and sample
alone and against stock, at a decode batch, and with launch choices of its CONFIG (timing only: a choice that moves
the log-sum-exp's tree, V_CHUNK or BLOCK_V, changes bits and is here only to see what it would buy).

    PYTHONPATH=. python benchmarks/bench_lmhead_decode.py [--tokens 64] [--vocab 151936] [--hidden 1024] --out DIR

CUDA-graph replay of back-to-back calls on rotating input copies (benchmarks/harness.py), interleaved rounds,
medians; the floor is the weight's bytes at the copy bandwidth.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tik_kernels  # noqa: E402,F401
from benchmarks import harness as H  # noqa: E402
from tik_kernels.e2e.model import config_overrides  # noqa: E402
from tik_kernels.ops import logprob as LP  # noqa: E402
from tik_kernels.ops import sample as SA  # noqa: E402

VARIANTS = {
    "sample_logprob": {},
    "slp BLOCK_T=32": {"BLOCK_T": 32},
    "slp BLOCK_T=16": {"BLOCK_T": 16},
    "slp warps=4": {"num_warps": 4},
    "slp stages=2": {"num_stages": 2},
    "slp stages=4": {"num_stages": 4},
    "slp V_CHUNK=1024 (tree)": {"V_CHUNK": 1024},
    "slp V_CHUNK=2048 (tree)": {"V_CHUNK": 2048},
    "slp BLOCK_T=16 V_CHUNK=2048 (tree)": {"BLOCK_T": 16, "V_CHUNK": 2048},
    "slp warps=4 stages=4": {"num_warps": 4, "num_stages": 4},
    "slp warps=4 stages=2": {"num_warps": 4, "num_stages": 2},
    "slp warps=4 BLOCK_T=32": {"num_warps": 4, "BLOCK_T": 32},
    "slp warps=4 BLOCK_V=64 (tree)": {"num_warps": 4, "BLOCK_V": 64},
    "slp BLOCK_V=64 (tree)": {"BLOCK_V": 64},
}


def main() -> int:
    from tik_tui.cli.common import positive_int

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=positive_int, default=64)
    ap.add_argument("--vocab", type=positive_int, default=151936)
    ap.add_argument("--hidden", type=positive_int, default=1024)
    ap.add_argument("--rounds", type=positive_int, default=9)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(args.tokens, args.hidden, device=dev, dtype=torch.bfloat16, generator=g)
    w = (torch.randn(args.vocab, args.hidden, device=dev, dtype=torch.bfloat16, generator=g) * 0.05)
    seeds = torch.arange(args.tokens, device=dev, dtype=torch.int64) * 7919 + 1
    ids = torch.randint(0, args.vocab, (args.tokens,), device=dev, generator=g)

    def variant(over):
        def run(h, w, seeds, ids):
            with config_overrides({"logprob": over}):
                return LP.sample_logprob(h, w, 1.0, seeds)
        return run

    def stock(h, w, seeds, ids):
        z = torch.nn.functional.linear(h, w).float()
        tok = torch.argmax(z - torch.log(-torch.log(torch.rand_like(z))), dim=-1)
        return tok, torch.gather(torch.log_softmax(z, -1), 1, tok[:, None])[:, 0]

    contenders = {name: variant(over) for name, over in VARIANTS.items()}
    contenders["logprob alone"] = lambda h, w, seeds, ids: LP.logprob(h, w, ids, 1.0)
    contenders["sample alone"] = lambda h, w, seeds, ids: SA.sample(h, w, 1.0, seeds)
    contenders["sample, then logprob of its token"] = lambda h, w, seeds, ids: LP.logprob(
        h, w, SA.sample(h, w, 1.0, seeds), 1.0)
    contenders["stock (cuBLAS logits, log_softmax, gumbel argmax)"] = stock
    res = H.compare(contenders, (h, w, seeds, ids), rounds=args.rounds if dev == "cuda" else 1,
                    nbytes=w.numel() * 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"env": H.environment(dev), "command": H.command_line(), "tokens": args.tokens, "vocab": args.vocab,
           "hidden": args.hidden, "floor_us": w.numel() * 2 / (H.COPY_TBPS * 1e12) * 1e6, **res}
    for c in doc["contenders"].values():
        c.pop("samples_us", None)
    H.write_json(out / "lmhead_decode.json", doc)
    base = doc["contenders"]["sample_logprob"].get("median_us")
    for name, c in doc["contenders"].items():
        med = c.get("median_us")
        print(f"{name:52s} {med if med is None else round(med, 1)!s:>8} us"
              + (f"  x{med / base:.3f} of sample_logprob" if med and base else "")
              + (f"  {c['error']}" if "error" in c else ""))
    print(f"floor (weight at {H.COPY_TBPS} TB/s): {doc['floor_us']:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
