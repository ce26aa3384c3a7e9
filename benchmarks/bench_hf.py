"""apply_tik on a Hugging Face Qwen3 model: rollout log-probs equal to the trainer's, and what it costs.

A random-init Qwen3ForCausalLM with the Qwen3-0.6B config (written here: no network), full depth, bf16, twice:
stock (SDPA attention, cuBLAS) and patched with `apply_tik`. For each: batched `generate` (sampled, prompts of
different lengths, left padding, output_logits), then the training step (forward + backward over the generated
sequences). Reported: the fraction of generated tokens whose log-prob (and logit row) the training forward
reproduces bit for bit, max |Δlogp|, and generate / training-step wall time, patched over stock.

Log-probs: patched, the fused `token_logprobs` kernel on the last hidden states, in both places; stock,
log_softmax over fp32 copies of the logits, in both places. The trainer is given generate's positions.

    PYTHONPATH=. python benchmarks/bench_hf.py --out benchmarks/results        # H200: ~2-3 min
    PYTHONPATH=. python benchmarks/bench_hf.py --tiny --out /tmp/hf            # CPU interpreter smoke run
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tik_kernels  # noqa: E402,F401  (sets TRITON_INTERPRET on a CPU before triton is imported)

# isort: split
import torch  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from benchmarks.harness import environment  # noqa: E402
from tik_kernels.hf import apply_tik, generated_logprobs, token_logprobs  # noqa: E402

#: Qwen/Qwen3-0.6B's config.json, the fields that shape the model
QWEN3_06B = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
    tie_word_embeddings=True, hidden_act="silu", attention_bias=False, attention_dropout=0.0,
)  # fmt: skip
TINY = dict(QWEN3_06B, vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
PAD = 0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_model(fields: dict, layers: int | None, device: str) -> torch.nn.Module:
    # no EOS: every row generates exactly --new tokens
    fields = dict(fields, pad_token_id=PAD, bos_token_id=1, eos_token_id=None, attn_implementation="sdpa")
    if layers:
        fields["num_hidden_layers"] = layers
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen3ForCausalLM(Qwen3Config(**fields)).to(torch.bfloat16).eval()


def make_prompts(lengths: list[int], vocab: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(lengths)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (len(lengths), width), generator=g)
    mask = (torch.arange(width)[None, :] >= width - torch.tensor(lengths)[:, None]).long()
    return (ids * mask).to(device), mask.to(device)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def generate(model, ids, mask, new: int, device: str):
    torch.manual_seed(2)
    sync(device)
    t = time.perf_counter()
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=True, top_k=0,
        top_p=1.0, temperature=1.0, output_logits=True, output_hidden_states=True, return_dict_in_generate=True,
        pad_token_id=PAD,
    )  # fmt: skip
    sync(device)
    return out, time.perf_counter() - t


def train_step(model, patched: bool, seq, mask, device: str):
    """Forward + backward of the policy-gradient-shaped loss over every next token; returns (logp, seconds)."""
    model.train()
    model.zero_grad(set_to_none=True)
    weight = mask[:, 1:].float()
    sync(device)
    t = time.perf_counter()
    if patched:
        hidden = model.model(input_ids=seq, attention_mask=mask).last_hidden_state
        logp = token_logprobs(hidden[:, :-1], model.lm_head.weight, seq[:, 1:])
    else:
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        logits = model(input_ids=seq, attention_mask=mask, position_ids=pos).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, seq[:, 1:, None])[..., 0]
    (-(logp * weight).sum() / weight.sum()).backward()
    sync(device)
    dt = time.perf_counter() - t
    model.eval()
    return logp.detach(), dt


def training_logit_rows(model, patched: bool, seq, mask) -> torch.Tensor:
    """The training forward's logits [B, S, V] (fp32 copy), without grad."""
    with torch.no_grad():
        if patched:
            return model.lm_head(model.model(input_ids=seq, attention_mask=mask).last_hidden_state).float()
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        return model(input_ids=seq, attention_mask=mask, position_ids=pos).logits.float()


def compare(model, patched: bool, out, train_logp, seq, mask, width: int, new: int) -> dict:
    B = seq.shape[0]
    if patched:
        gen_logp = generated_logprobs(model, out)
    else:
        rows = torch.stack(out.logits, 1)  # [B, N, V] fp32 copies of generate's bf16 logits
        gen_logp = torch.log_softmax(rows, -1).gather(-1, seq[:, -new:, None])[..., 0]
    trn_logp = train_logp[:, width - 1 : width - 1 + new]
    lp_equal = (gen_logp.view(torch.int32) == trn_logp.view(torch.int32)).sum().item()
    logits = training_logit_rows(model, patched, seq, mask)
    row_equal = sum(
        torch.equal(out.logits[j][b], logits[b, width - 1 + j]) for j in range(new) for b in range(B)
    )
    del logits
    return {
        "tokens": B * new,
        "logprob_equal": lp_equal,
        "logprob_equal_frac": lp_equal / (B * new),
        "logit_rows_equal": int(row_equal),
        "max_abs_dlogp": (gen_logp - trn_logp).abs().max().item(),
    }


def run_model(name: str, model, patched: bool, ids, mask, args) -> dict:
    width = ids.shape[1]
    log(f"{name}: warm-up (Triton compiles on first use)")
    out, _ = generate(model, ids, mask, 2, args.device)
    full = torch.cat([mask, torch.ones_like(out.sequences[:, width:])], 1)
    train_step(model, patched, out.sequences, full, args.device)
    gen_s, train_s = [], []
    result = None
    for r in range(args.repeats):
        out, dt = generate(model, ids, mask, args.new, args.device)
        gen_s.append(dt)
        log(f"{name}: generate {ids.shape[0]} x {args.new} tokens in {dt:.2f} s")
        seq = out.sequences
        full = torch.cat([mask, torch.ones_like(seq[:, width:])], 1)
        logp, dt = train_step(model, patched, seq, full, args.device)
        train_s.append(dt)
        log(f"{name}: training step over {tuple(seq.shape)} in {dt:.3f} s")
        if r == 0:
            result = compare(model, patched, out, logp, seq, full, width, args.new)
            result["_kept"] = (seq, full, logp)
            log(f"{name}: {result['logprob_equal']} / {result['tokens']} log-probs bitwise equal, "
                f"{result['logit_rows_equal']} logit rows, max |dlogp| {result['max_abs_dlogp']:.3g}")
        del out
    return result | {"generate_s": statistics.median(gen_s), "train_step_s": statistics.median(train_s),
                     "generate_s_all": gen_s, "train_step_s_all": train_s}  # fmt: skip


def write(doc: dict, out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    s, p = doc["stock"], doc["tik"]
    e = doc["env"]
    lines = [
        f"# apply_tik on a random-init Qwen3 ({doc['config']}), {doc['batch']} prompts of {doc['prompt_lengths']} "
        f"tokens (left-padded), {doc['new']} sampled tokens each",
        "",
        f"{e['gpu'] or e['device']}, driver {e['driver']}, torch {e['torch']}, triton {e['triton']}, "
        f"transformers {doc['transformers']}",
        "",
        "| model | log-probs bitwise equal (generate vs training) | logit rows equal | max abs dlogp "
        "| generate s | training step s |",
        "|---|---|---|---|---|---|",
    ]
    for label, r in (("stock (SDPA, cuBLAS)", s), ("apply_tik", p)):
        lines.append(
            f"| {label} | {r['logprob_equal']} / {r['tokens']} ({100 * r['logprob_equal_frac']:.1f}%) "
            f"| {r['logit_rows_equal']} / {r['tokens']} | {r['max_abs_dlogp']:.3g} | {r['generate_s']:.2f} "
            f"| {r['train_step_s']:.3f} |"
        )
    lines += [
        "",
        f"apply_tik / stock: generate {doc['ratio']['generate']:.2f}x, training step {doc['ratio']['train_step']:.2f}x "
        f"(medians of {doc['repeats']} runs after a warm-up; lower is faster)",
        "",
        f"apply_tik's training log-probs against stock's on the same sequences (every real next token): "
        f"max abs {doc['tik_vs_stock']['max_abs_dlogp']:.3g}, mean abs {doc['tik_vs_stock']['mean_abs_dlogp']:.3g}",
        "",
        f"`{doc['command']}`",
        "",
    ]
    (out / f"{name}.md").write_text("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--name", default="hf_h200")
    ap.add_argument("--layers", type=int, default=None, help="default: the config's 28")
    ap.add_argument("--lengths", default="256,17,128,64,200,33,96,150", help="prompt lengths, one per sequence")
    ap.add_argument("--new", type=int, default=64, help="tokens generated per prompt")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="a tiny config on the CPU (checks the script, no timing)")
    ap.add_argument("--device", default=None)
    args = ap.parse_args()
    import transformers

    fields = TINY if args.tiny else QWEN3_06B
    if args.tiny:
        args.lengths, args.new, args.repeats = "6,2,4", 3, 1
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    lengths = [int(x) for x in args.lengths.split(",")]
    t0 = time.time()
    log(f"building {'tiny' if args.tiny else 'Qwen3-0.6B'}-config model on {args.device}")
    stock = make_model(fields, args.layers, args.device)
    tik = apply_tik(copy.deepcopy(stock))
    ids, mask = make_prompts(lengths, fields["vocab_size"], args.device)
    doc = {
        "command": " ".join(["python benchmarks/bench_hf.py", *sys.argv[1:]]),
        "env": environment(args.device),
        "transformers": transformers.__version__,
        "config": "tiny" if args.tiny else "Qwen3-0.6B",
        "layers": stock.config.num_hidden_layers,
        "batch": len(lengths),
        "prompt_lengths": lengths,
        "new": args.new,
        "repeats": args.repeats,
    }
    doc["stock"] = run_model("stock", stock, False, ids, mask, args)
    doc["tik"] = run_model("apply_tik", tik, True, ids, mask, args)
    # the same function? stock's log-probs of the sequences apply_tik generated, against apply_tik's own
    seq, full, tik_logp = doc["tik"].pop("_kept")
    doc["stock"].pop("_kept")
    with torch.no_grad():
        pos = (full.cumsum(1) - 1).clamp(min=0)
        logits = stock(input_ids=seq, attention_mask=full, position_ids=pos).logits[:, :-1].float()
        stock_logp = torch.log_softmax(logits, -1).gather(-1, seq[:, 1:, None])[..., 0]
        del logits
    diff = (tik_logp - stock_logp)[full[:, 1:].bool()].abs()
    doc["tik_vs_stock"] = {"max_abs_dlogp": diff.max().item(), "mean_abs_dlogp": diff.mean().item()}
    log(f"apply_tik vs stock on the same sequences: max |dlogp| {diff.max().item():.3g}, mean {diff.mean().item():.3g}")
    doc["ratio"] = {
        "generate": doc["tik"]["generate_s"] / doc["stock"]["generate_s"],
        "train_step": doc["tik"]["train_step_s"] / doc["stock"]["train_step_s"],
    }
    doc["wall_s"] = time.time() - t0
    write(doc, args.out, args.name)
    log(f"wrote {args.out / args.name}.json and .md ({doc['wall_s']:.0f} s)")
    print((args.out / f"{args.name}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
