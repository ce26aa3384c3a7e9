"""The decode step's lm_head: sample_logprob (the token and its log-prob in one pass) against logprob and sample
alone and against stock, at a decode batch, and with launch choices of its CONFIG (timing only: a choice that moves
the log-sum-exp's tree, V_CHUNK or BLOCK_V, changes bits and is here only to see what it would buy).

    PYTHONPATH=. python benchmarks/bench_lmhead_decode.py [--tokens 64] [--vocab 151936] [--hidden 1024] --out DIR
    [--only REGEX]   (the contenders whose name matches, beside sample_logprob and the plain stock one)

CUDA-graph replay of back-to-back calls on rotating input copies (benchmarks/harness.py), interleaved rounds,
medians; the floor is the weight's bytes at the copy bandwidth.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tik_kernels  # noqa: E402,F401
from benchmarks import harness as H  # noqa: E402
from tik_kernels.e2e.backends import StockBackend, config_overrides  # noqa: E402
from tik_kernels.ops import logprob as LP  # noqa: E402
from tik_kernels.ops import sample as SA  # noqa: E402

#: name -> (the call, {operator: CONFIG overrides}). The call: "slp" sample_logprob's one pass, "sample", "logprob",
#: "both" sample then logprob of its token. The sampler's token is an argmax with ties to the lowest index, the same
#: whatever the order its chunks and tiles are merged in, so sample's V_CHUNK and BLOCK_V only launch it (no bits);
#: logprob's (and sample_logprob's) set the log-sum-exp's tree: "(tree)" marks a variant that would change its bits.
#: CHUNKS (chunks one program walks in turn) launches either without moving a bit, nor does MERGE_STAGES (the
#: combine's chunk loop software-pipelined: the same merges in the same order), nor FLAT (a chunk's tiles and K steps
#: in one loop), nor SLP_STAGES (the pass's pipeline depth), nor SLP_MAXNREG (its register cap). BLOCK_T (tokens a
#: program holds) does on Hopper, though a row's dots are its own: 64 rows compile to wgmma, 32 to mma.sync (sm_90
#: PTX, Triton 3.6), which lay the logits out over the threads differently, and so add a tile's row of exps (`tl.sum`
#: in `_lse_step`) in another order, if the MMAs themselves agree (not isolated); "(mma)" marks it (bits differed on
#: an H100, results/lmhead_decode_h100_s28.json). The run checks the rest: every "slp" variant without "(tree)" or
#: "(mma)" is compared bit for bit with the default at the benchmark's shape
VARIANTS = {
    "sample_logprob": ("slp", {}),
    "slp MERGE_STAGES=1 (the combine before session 25)": ("slp", {"logprob": {"MERGE_STAGES": 1}}),
    "slp MERGE_STAGES=2": ("slp", {"logprob": {"MERGE_STAGES": 2}}),
    "slp MERGE_STAGES=4": ("slp", {"logprob": {"MERGE_STAGES": 4}}),
    "slp CHUNKS=2": ("slp", {"logprob": {"CHUNKS": 2}}),
    "slp CHUNKS=4": ("slp", {"logprob": {"CHUNKS": 4}}),
    "slp warps=4 CHUNKS=4": ("slp", {"logprob": {"num_warps": 4, "CHUNKS": 4}}),
    "slp warps=4": ("slp", {"logprob": {"num_warps": 4}}),
    "slp nested 3 stages uncapped (the CONFIG before session 28)": ("slp", {"logprob": {"FLAT": 0, "SLP_STAGES": 3,
                                                                                     "SLP_MAXNREG": 0}}),
    "slp nested 4 stages": ("slp", {"logprob": {"FLAT": 0, "SLP_STAGES": 4}}),
    "slp FLAT 3 stages": ("slp", {"logprob": {"FLAT": 1, "SLP_STAGES": 3}}),
    "slp FLAT 2 stages": ("slp", {"logprob": {"FLAT": 1, "SLP_STAGES": 2}}),
    "slp maxnreg=0 (uncapped: the CONFIG before session 29)": ("slp", {"logprob": {"SLP_MAXNREG": 0}}),
    "slp maxnreg=168": ("slp", {"logprob": {"SLP_MAXNREG": 168}}),
    "slp maxnreg=80 3 stages (3 programs an SM)": ("slp", {"logprob": {"SLP_MAXNREG": 80, "SLP_STAGES": 3}}),
    "slp maxnreg=80": ("slp", {"logprob": {"SLP_MAXNREG": 80}}),
    "slp nested 3 stages capped": ("slp", {"logprob": {"FLAT": 0, "SLP_STAGES": 3}}),
    "slp BLOCK_T=32 (mma)": ("slp", {"logprob": {"BLOCK_T": 32}}),
    "slp BLOCK_T=32 nested (mma)": ("slp", {"logprob": {"BLOCK_T": 32, "FLAT": 0, "SLP_STAGES": 3}}),
    "slp V_CHUNK=2048 (tree)": ("slp", {"logprob": {"V_CHUNK": 2048}}),
    "slp warps=4 V_CHUNK=2048 (tree)": ("slp", {"logprob": {"num_warps": 4, "V_CHUNK": 2048}}),
    "slp warps=4 BLOCK_V=64 V_CHUNK=2048 (tree)": ("slp", {"logprob": {"num_warps": 4, "BLOCK_V": 64,
                                                                        "V_CHUNK": 2048}}),
    "sample alone": ("sample", {}),
    "sample MERGE_STAGES=1": ("sample", {"sample": {"MERGE_STAGES": 1}}),
    "sample V_CHUNK=512 (its CONFIG until session 21)": ("sample", {"sample": {"V_CHUNK": 512}}),
    "sample V_CHUNK=2048": ("sample", {"sample": {"V_CHUNK": 2048}}),
    "sample V_CHUNK=4096": ("sample", {"sample": {"V_CHUNK": 4096}}),
    "sample warps=4": ("sample", {"sample": {"num_warps": 4}}),
    "sample CHUNKS=2": ("sample", {"sample": {"CHUNKS": 2}}),
    "sample V_CHUNK=512 CHUNKS=2": ("sample", {"sample": {"V_CHUNK": 512, "CHUNKS": 2}}),
    "sample warps=4 V_CHUNK=2048": ("sample", {"sample": {"num_warps": 4, "V_CHUNK": 2048}}),
    "sample BLOCK_V=256 V_CHUNK=2048": ("sample", {"sample": {"BLOCK_V": 256, "V_CHUNK": 2048}}),
    "sample stages=4 V_CHUNK=2048": ("sample", {"sample": {"num_stages": 4, "V_CHUNK": 2048}}),
    "sample BLOCK_T=32 V_CHUNK=2048": ("sample", {"sample": {"BLOCK_T": 32, "V_CHUNK": 2048}}),
    "sample V_WAVES=1": ("sample", {"sample": {"V_WAVES": 1}}),
    "sample V_WAVES=2": ("sample", {"sample": {"V_WAVES": 2}}),
    "sample V_WAVES=3": ("sample", {"sample": {"V_WAVES": 3}}),
    "sample V_WAVES=1 warps=4": ("sample", {"sample": {"V_WAVES": 1, "num_warps": 4}}),
    "sample V_WAVES=2 BLOCK_V=64": ("sample", {"sample": {"V_WAVES": 2, "BLOCK_V": 64}}),
    "logprob alone": ("logprob", {}),
    "logprob MERGE_STAGES=1": ("logprob", {"logprob": {"MERGE_STAGES": 1}}),
    "logprob warps=4": ("logprob", {"logprob": {"num_warps": 4}}),
    "logprob stages=4": ("logprob", {"logprob": {"num_stages": 4}}),
    "logprob CHUNKS=2": ("logprob", {"logprob": {"CHUNKS": 2}}),
    "logprob CHUNKS=4": ("logprob", {"logprob": {"CHUNKS": 4}}),
    "logprob V_CHUNK=1024 (tree)": ("logprob", {"logprob": {"V_CHUNK": 1024}}),
    "logprob V_CHUNK=2048 (tree)": ("logprob", {"logprob": {"V_CHUNK": 2048}}),
    "logprob V_CHUNK=4096 (tree)": ("logprob", {"logprob": {"V_CHUNK": 4096}}),
    "logprob warps=4 V_CHUNK=2048 (tree)": ("logprob", {"logprob": {"num_warps": 4, "V_CHUNK": 2048}}),
    "logprob BLOCK_V=256 V_CHUNK=2048 (tree)": ("logprob", {"logprob": {"BLOCK_V": 256, "V_CHUNK": 2048}}),
    "sample, then logprob of its token": ("both", {}),
    "both V_CHUNK=2048 (logprob's tree)": ("both", {"sample": {"V_CHUNK": 2048}, "logprob": {"V_CHUNK": 2048}}),
}


def main() -> int:
    from tik_tui.cli.common import positive_int, regex

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=positive_int, default=64)
    ap.add_argument("--vocab", type=positive_int, default=151936)
    ap.add_argument("--hidden", type=positive_int, default=1024)
    ap.add_argument("--rounds", type=positive_int, default=9)
    ap.add_argument("--only", default=None, metavar="REGEX", type=regex,
                    help="only the contenders whose name matches (re.search), beside sample_logprob and plain stock")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(args.tokens, args.hidden, device=dev, dtype=torch.bfloat16, generator=g)
    w = (torch.randn(args.vocab, args.hidden, device=dev, dtype=torch.bfloat16, generator=g) * 0.05)
    seeds = torch.arange(args.tokens, device=dev, dtype=torch.int64) * 7919 + 1
    ids = torch.randint(0, args.vocab, (args.tokens,), device=dev, generator=g)

    def variant(call, over):
        def run(h, w, seeds, ids):
            with config_overrides(over):
                if call == "slp":
                    return LP.sample_logprob(h, w, 1.0, seeds)
                if call == "sample":
                    return SA.sample(h, w, 1.0, seeds)
                if call == "logprob":
                    return LP.logprob(h, w, ids, 1.0)
                return LP.logprob(h, w, SA.sample(h, w, 1.0, seeds), 1.0)
        return run

    def stock(h, w, seeds, ids):
        z = torch.nn.functional.linear(h, w).float()
        tok = torch.argmax(z - torch.log(-torch.log(torch.rand_like(z))), dim=-1)
        return tok, torch.gather(torch.log_softmax(z, -1), 1, tok[:, None])[:, 0]

    def chosen(name: str) -> bool:  # --only
        return args.only is None or re.search(args.only, name) is not None

    contenders = {name: variant(call, over) for name, (call, over) in VARIANTS.items()
                  if name == "sample_logprob" or chosen(name)}
    contenders["stock (cuBLAS logits, log_softmax, gumbel argmax)"] = stock
    # mode A's own lm_head (tik_kernels/e2e/backends.py StockBackend.sample_logprob), eager and through torch.compile:
    # with automatic dynamic shapes (compiled first at half the batch, then at this one: the batch goes symbolic, the
    # vocabulary stays a constant, as in the decode engine's buckets) and with every dimension symbolic
    stocks = {"mode A eager": StockBackend()}
    if dev == "cuda":
        stocks |= {"mode A compiled": StockBackend(compiled=True),
                   "mode A compiled, all dims symbolic": StockBackend(compiled=True, compile_dynamic=True)}
    stocks = {n: be for n, be in stocks.items() if chosen(n)}
    for name, be in stocks.items():
        be.sample_logprob(h[: max(1, args.tokens // 2)], w, 1.0, seeds[: max(1, args.tokens // 2)])
        contenders[name] = lambda h, w, seeds, ids, be=be: be.sample_logprob(h, w, 1.0, seeds)
    if dev == "cuda":
        # as decode_breakdown first meets it: compiled at this very batch, under no_grad (where mode A's lm_head took
        # 4.9 ms of the step on an H100, decode_breakdown_h100_qwen3-0.6b_s21_stock_unified.md)
        for name, dyn in (("mode A compiled, first at this batch under no_grad", None),
                          ("mode A compiled, all dims symbolic, first at this batch under no_grad", True)):
            if not chosen(name):
                continue
            be = StockBackend(compiled=True, compile_dynamic=dyn)
            with torch.no_grad():
                be.sample_logprob(h, w, 1.0, seeds)
            contenders[name] = lambda h, w, seeds, ids, be=be: be.sample_logprob(h, w, 1.0, seeds)
    # a one-pass variant that claims no bit change (no "(tree)" or "(mma)" in its name) is checked against the
    # default's token and log-prob bits here, at this shape
    ref = contenders["sample_logprob"](h, w, seeds, ids)
    bits = {name: H.tree_bits_equal(fn(h, w, seeds, ids), ref) for name, fn in contenders.items()
            if name.startswith("slp ") and "(tree)" not in name and "(mma)" not in name}
    res = H.compare(contenders, (h, w, seeds, ids), rounds=args.rounds if dev == "cuda" else 1,
                    nbytes=w.numel() * 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"env": H.environment(dev), "command": H.command_line(), "tokens": args.tokens, "vocab": args.vocab,
           "hidden": args.hidden, "floor_us": w.numel() * 2 / (H.COPY_TBPS * 1e12) * 1e6, **res}
    for name, c in doc["contenders"].items():
        c.pop("samples_us", None)
        if name in bits:
            c["bits_equal_default"] = bits[name]
    H.write_json(out / f"lmhead_decode_{H.card_tag(dev)}.json", doc)
    base = doc["contenders"]["sample_logprob"].get("median_us")
    for name, c in doc["contenders"].items():
        med = c.get("median_us")
        print(f"{name:52s} {med if med is None else round(med, 1)!s:>8} us"
              + (f"  x{med / base:.3f} of sample_logprob" if med and base else "")
              + (f"  {c['error']}" if "error" in c else "")
              + ("" if name not in bits else "  bits: same" if bits[name] else "  BITS DIFFER from sample_logprob"))
    print(f"floor (weight at {H.COPY_TBPS} TB/s): {doc['floor_us']:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
