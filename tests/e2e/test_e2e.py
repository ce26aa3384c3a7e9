"""End to end on CPU: the tiny model in the Triton interpreter.

Mode B's rollout log-probs must equal the trainer's bit for bit although the rollout decodes
in batches that change every step (continuous batching) and the trainer runs one packed forward.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch

import tik_kernels  # noqa: F401
from tik_kernels.e2e.backends import StockBackend
from tik_kernels.e2e.model import PRESETS, bf16_weights, forward_packed, init_params, load_hf
from tik_kernels.e2e.rollout import Request, RolloutEngine
from tik_kernels.e2e.run import E2EConfig, run_e2e
from tik_kernels.e2e.safetensors_io import CheckpointError, load_file, save_file
from tik_kernels.e2e.task import make_requests
from tik_kernels.e2e.trainer import pack


def test_mode_b_rollout_logprobs_equal_trainer_bitwise_under_changing_batches():
    cfg = E2EConfig(preset="tiny", modes=("B",), steps=2, prompts=3, group=3, max_slots=4, answer_len=(2, 5))
    out = run_e2e(cfg)
    b = out["modes"]["B"]
    assert b["tokens"] > 20
    assert b["equal_tokens"] == b["tokens"], b
    assert b["max_abs_dlogp"] == 0.0
    # the decode batch really changed composition: several sizes were seen
    assert len(b["decode_batch_sizes"]) >= 3, b["decode_batch_sizes"]


def test_same_request_same_tokens_whatever_the_batch():
    """A request's tokens and log-probs do not depend on which other requests share its batches."""
    from tik_kernels.e2e.backends import make_backend

    mc = PRESETS["tiny"]
    params = init_params(mc, 1)
    be = make_backend("unified")
    target = Request([5, 9, 11, 2], max_new=4, seed=77)
    alone = RolloutEngine(mc, be, max_slots=1, max_len=16).generate(params, [target])[0]
    rng = random.Random(3)
    crowd = make_requests(mc.vocab, 3, 2, rng, answer_len=(1, 5))
    with_others = RolloutEngine(mc, be, max_slots=4, max_len=16, admit_per_step=2).generate(
        params, [*crowd[:3], target, *crowd[3:]])[3]
    assert with_others.request is target
    assert alone.tokens == with_others.tokens
    assert torch.equal(alone.old_logprobs().view(torch.int32), with_others.old_logprobs().view(torch.int32))


def test_a_tied_lm_head_is_the_embedding_in_rollout_and_training():
    """A tied model (the Qwen3 presets) computes what an untied copy with lm_head = embed computes, rollout log-probs
    and training alike, and the table's gradient is the sum of its two uses' (an fp32 sum of the two casts' grads)."""
    from tik_kernels.e2e.backends import make_backend
    from tik_kernels.e2e.trainer import sequence_logprobs

    tied = replace(PRESETS["tiny"], tie_embeddings=True)
    params = init_params(tied, 4)
    assert "lm_head" not in params
    untied = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    untied["lm_head"] = params["embed"].detach().clone().requires_grad_(True)
    be = make_backend("unified")
    reqs = make_requests(tied.vocab, 2, 2, random.Random(5), answer_len=(2, 4))
    a = RolloutEngine(tied, be, max_slots=4, max_len=16).generate(params, reqs)
    b = RolloutEngine(PRESETS["tiny"], be, max_slots=4, max_len=16).generate(untied, reqs)
    assert [c.tokens for c in a] == [c.tokens for c in b]
    assert all(torch.equal(x.old_logprobs(), y.old_logprobs()) for x, y in zip(a, b, strict=True))
    packed = pack(a, "cpu")
    lp_t, _ = sequence_logprobs(tied, be, params, packed, 1.0, grad=True)
    lp_u, _ = sequence_logprobs(PRESETS["tiny"], be, untied, packed, 1.0, grad=True)
    assert torch.equal(lp_t, lp_u)
    assert torch.equal(lp_t.detach(), torch.cat([c.old_logprobs() for c in a]))
    lp_t.sum().backward()
    lp_u.sum().backward()
    assert torch.equal(params["embed"].grad, untied["embed"].grad + untied["lm_head"].grad)
    assert untied["embed"].grad.abs().sum() > 0 and untied["lm_head"].grad.abs().sum() > 0


def test_the_rollout_s_fused_mlp_keeps_the_bits_and_follows_weight_updates():
    """The rollout's gate_up projection and silu_mul in one launch give the two calls' tokens and log-probs, before
    and after load_weights copies updated weights in place; the trainer's forward (a gradient) keeps the two calls."""
    from tik_kernels.e2e.backends import UnifiedBackend

    mc = PRESETS["tiny"]
    params = init_params(mc, 6)
    reqs = make_requests(mc.vocab, 2, 2, random.Random(7), answer_len=(2, 5))
    fused = RolloutEngine(mc, UnifiedBackend(fused_mlp=True), max_slots=4, max_len=16)
    plain = RolloutEngine(mc, UnifiedBackend(), max_slots=4, max_len=16)
    for step in range(2):
        a, b = fused.generate(params, reqs), plain.generate(params, reqs)
        assert [c.tokens for c in a] == [c.tokens for c in b], step
        assert all(torch.equal(x.old_logprobs(), y.old_logprobs()) for x, y in zip(a, b, strict=True)), step
        with torch.no_grad():
            for v in params.values():
                v.add_(0.01 * torch.randn(v.shape, generator=torch.Generator().manual_seed(step)))
    assert fused.W.keys() == plain.W.keys()  # the weights as they are: no layout of the fused launch's own
    # a linear or silu_mul module from a file (a candidate): not the library's epilogue, the two calls
    import tik_kernels.ops.linear as L
    import tik_kernels.ops.silu_mul as S

    assert UnifiedBackend(fused_mlp=True).fused_mlp and not UnifiedBackend().fused_mlp
    assert not UnifiedBackend(impl_files={"linear": L.__file__}, fused_mlp=True).fused_mlp
    assert not UnifiedBackend(impl_files={"silu_mul": S.__file__}, fused_mlp=True).fused_mlp
    # where a gradient is needed the one launch (which has none) declines, and the model makes the two calls
    be = UnifiedBackend(fused_mlp=True)
    x = torch.randn(3, mc.hidden).to(torch.bfloat16)
    w = (torch.randn(2 * mc.ffn, mc.hidden) * mc.hidden**-0.5).to(torch.bfloat16)
    assert be.gate_up_silu(x, w) is not None
    assert be.gate_up_silu(x.requires_grad_(), w) is None


def test_pack_rows_point_at_the_tokens_that_predict_the_answer():
    from tik_kernels.e2e.rollout import Completion

    c1 = Completion(Request([1, 2, 3], 2, 0), tokens=[7, 8])
    c2 = Completion(Request([4, 5], 3, 0), tokens=[9, 10, 11])
    p = pack([c1, c2], "cpu")
    assert p.ids.tolist() == [1, 2, 3, 7, 4, 5, 9, 10]
    assert p.cu_seqlens.tolist() == [0, 4, 8]
    assert p.rows.tolist() == [2, 3, 5, 6, 7]
    assert p.targets.tolist() == [7, 8, 9, 10, 11]
    assert p.seq_of_row.tolist() == [0, 0, 1, 1, 1] and p.lens == [4, 4] and p.cu_seqlens.dtype == torch.int32


def test_pack_is_the_loop_it_replaced_on_many_sequences():
    """pack's array operations give, sequence by sequence, what a plain loop over the completions gives (prompts and
    answers of one token among them)."""
    from tik_kernels.e2e.rollout import Completion

    rng = random.Random(5)
    comps = [Completion(Request([rng.randrange(1000) for _ in range(rng.choice([1, 2, 40]))], 9, i),
                        tokens=[rng.randrange(1000) for _ in range(rng.choice([1, 2, 9]))]) for i in range(50)]
    ids, cu, rows, targets, seq = [], [0], [], [], []
    for j, c in enumerate(comps):
        P, A = len(c.request.prompt), len(c.tokens)
        rows += range(cu[-1] + P - 1, cu[-1] + P - 1 + A)
        targets += c.tokens
        seq += [j] * A
        ids += c.request.prompt + c.tokens[:-1]
        cu.append(len(ids))
    p = pack(comps, "cpu")
    assert (p.ids.tolist(), p.cu_seqlens.tolist(), p.rows.tolist(), p.targets.tolist(), p.seq_of_row.tolist()) == (
        ids, cu, rows, targets, seq)
    assert p.lens == [b - a for a, b in zip(cu[:-1], cu[1:], strict=True)]


def _write_hf_checkpoint(d, mc, params):
    cfg = {"model_type": "qwen3", "vocab_size": mc.vocab, "hidden_size": mc.hidden, "num_hidden_layers": mc.layers,
           "num_attention_heads": mc.heads, "num_key_value_heads": mc.kv_heads, "head_dim": mc.head_dim,
           "intermediate_size": mc.ffn, "rope_theta": mc.rope_theta, "rms_norm_eps": mc.eps}
    (d / "config.json").write_text(json.dumps(cfg))
    sd = {"model.embed_tokens.weight": params["embed"], "model.norm.weight": params["norm"]}
    if "lm_head" in params:  # save_pretrained writes no tied lm_head
        sd["lm_head.weight"] = params["lm_head"]
    for i in range(mc.layers):
        pre = f"model.layers.{i}."
        sd[pre + "input_layernorm.weight"] = params[f"l{i}.ln1"]
        sd[pre + "post_attention_layernorm.weight"] = params[f"l{i}.ln2"]
        q, k, v = params[f"l{i}.wqkv"].split([mc.heads * mc.head_dim] + [mc.kv_heads * mc.head_dim] * 2)
        for t, theirs in ((q, "q_proj"), (k, "k_proj"), (v, "v_proj"), (params[f"l{i}.wo"], "o_proj")):
            sd[pre + f"self_attn.{theirs}.weight"] = t
        sd[pre + "self_attn.q_norm.weight"] = params[f"l{i}.q_norm"]
        sd[pre + "self_attn.k_norm.weight"] = params[f"l{i}.k_norm"]
        gate, up = params[f"l{i}.w_gate_up"].chunk(2)
        sd[pre + "mlp.gate_proj.weight"], sd[pre + "mlp.up_proj.weight"] = gate, up
        sd[pre + "mlp.down_proj.weight"] = params[f"l{i}.w_down"]
    half = len(sd) // 2  # two shards, as real checkpoints come
    items = list(sd.items())
    save_file({k: v.detach().to(torch.bfloat16) for k, v in items[:half]}, d / "model-00001-of-00002.safetensors")
    save_file({k: v.detach().to(torch.bfloat16) for k, v in items[half:]}, d / "model-00002-of-00002.safetensors")


@pytest.mark.parametrize("tied", [False, True], ids=["lm_head", "tied"])
def test_hf_checkpoint_loader_roundtrip(tmp_path, tied):
    mc = replace(PRESETS["tiny"], tie_embeddings=tied)
    params = init_params(mc, 5)
    assert ("lm_head" in params) != tied
    _write_hf_checkpoint(tmp_path, mc, params)
    mc2, loaded = load_hf(tmp_path)
    assert mc2 == mc
    assert set(loaded) == set(params)
    for k in params:
        assert torch.equal(loaded[k].to(torch.bfloat16), params[k].detach().to(torch.bfloat16)), k
    # the loaded model computes what the original does
    be = StockBackend()
    ids = torch.tensor([1, 2, 3, 4, 5])
    cu = torch.tensor([0, 5], dtype=torch.int32)
    a = forward_packed(mc, be, bf16_weights(params, False), ids, cu)
    b = forward_packed(mc2, be, bf16_weights(loaded, False), ids, cu)
    assert torch.equal(a, b)


def test_safetensors_rejects_garbage(tmp_path):
    f = tmp_path / "x.safetensors"
    f.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CheckpointError, match="not JSON"):
        load_file(f)
    (tmp_path / "config.json").write_text('{"model_type": "qwen3"}')
    with pytest.raises(CheckpointError, match="lacks"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="model_type None is not supported"):
        load_hf(tmp_path)


def test_cli_e2e_names_mode_a_s_attention_path(capsys):
    """The summary says which stock attention mode A ran over the packed sequences (on the CPU: the padded path)."""
    from tik_tui.cli.main import main

    assert main(["e2e", "--modes", "A", "--steps", "1", "--prompts", "1", "--group", "2", "--ppo-epochs", "1"]) == 0
    text = capsys.readouterr().out
    assert "mode A: packed attention sdpa_padded (varlen_attn is CUDA's)" in text
    # one prompt, two samples: the second took a copy of the first's prefill
    assert "prefill (A): " in text and "1 request took a copy of their group's prompt" in text


def test_cli_e2e_json_and_errors(capsys):
    from tik_tui.cli.main import main

    assert main(["e2e", "--modes", "B", "--steps", "1", "--prompts", "1", "--group", "2", "--minibatches", "2",
                 "--ppo-epochs", "1", "--reward", "parity", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    b = doc["modes"]["B"]
    assert b["equal_tokens"] == b["tokens"] > 0
    assert doc["config"]["reward"] == "parity" and 0.0 < b["rewards"][0] < 1.0
    assert (b["minibatches"], b["ppo_epochs"]) == (2, 1) == (doc["config"]["minibatches"], doc["config"]["ppo_epochs"])
    # the train phase's host part before its first update is a part of it, the updates the rest
    assert 0.0 < b["train_prep_s"] < b["time_s"]["train"]
    # each timed step's phases' allocator counters: none off the GPU (the GPU's: test_alloc_counts_follow_the_driver)
    assert b["alloc_steps"] == {"rollout": [{}], "recompute": [{}], "train": [{}]}
    assert main(["e2e", "--modes", "B", "--minibatches", "0"]) == 2
    assert "--minibatches" in capsys.readouterr().err
    assert main(["e2e", "--modes", "X"]) == 2
    assert "unknown mode" in capsys.readouterr().err
    assert main(["e2e", "--model", "nope", "--modes", "A"]) == 2
    assert "unknown model preset" in capsys.readouterr().err


@pytest.mark.gpu
def test_alloc_counts_follow_the_driver():
    """A block the cache cannot serve is a cudaMalloc (num_device_alloc), and emptying the cache gives it back."""
    from tik_kernels.e2e.run import ALLOC_KEYS, alloc_counts, alloc_delta

    torch.cuda.empty_cache()
    a = alloc_counts("cuda")
    x = torch.empty(3 << 28, dtype=torch.uint8, device="cuda")  # 768 MiB: no cached block is that large
    b = alloc_counts("cuda")
    del x
    torch.cuda.empty_cache()
    c = alloc_counts("cuda")
    assert set(a) == set(ALLOC_KEYS)
    assert alloc_delta(a, b)["num_device_alloc"] >= 1 and alloc_delta(b, c)["num_device_free"] >= 1


def test_cli_e2e_out_of_memory_is_one_line(capsys, monkeypatch):
    """A mode that runs out of GPU memory is a one-line error naming the mode and phase and what makes a step smaller,
    with a non-zero exit, not a traceback."""
    import tik_kernels.e2e.run as run_mod
    from tik_tui.cli.main import main

    def oom(cfg, on_progress=None, **kw):
        on_progress({"mode": "A", "step": 1, "steps": 2, "phase": "train", "tokens": 0, "seconds": 0.0,
                     "done": False})
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 126.00 MiB.")

    monkeypatch.setattr(run_mod, "run_e2e", oom)
    assert main(["e2e", "--modes", "A", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("tik: error: mode A ran out of GPU memory in its train phase (step 1)"), err
    assert "--minibatches" in err[-1] and "Traceback" not in "\n".join(err)

