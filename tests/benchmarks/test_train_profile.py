"""benchmarks/train_profile.py on the CPU (the tiny preset): its code path; its timers leave nothing patched."""

import json

import torch

from benchmarks import train_profile as TP
from tik_kernels.e2e import trainer as trainer_mod


def test_a_pass_is_timed_part_by_part_and_nothing_stays_patched(tmp_path):
    originals = (trainer_mod.sequence_logprobs, torch.Tensor.backward, torch.nn.utils.clip_grad_norm_)
    assert TP.main(["--preset", "tiny", "--prompts", "2", "--group", "2", "--prompt-len", "3", "5", "--answer-len",
                    "2", "3", "--slots", "4", "--minibatches", "2", "--rounds", "2", "--out", str(tmp_path),
                    "--name", "tp"]) == 0
    assert (trainer_mod.sequence_logprobs, torch.Tensor.backward, torch.nn.utils.clip_grad_norm_) == originals
    doc = json.loads((tmp_path / "tp.json").read_text())
    assert doc["sequences"] == 4 and doc["minibatches"] == 2
    assert all(len(v) == 2 for v in doc["samples_s"].values())
    parts = doc["one_pass"]["parts_s"]
    assert {"forward_logprobs", "backward", "clip_grad_norm", "optimizer_step", "rest"} == set(parts)
    assert parts["forward_logprobs"] > 0 and parts["backward"] > 0
    # the updates' FLOPs: backward is twice the forward of what has gradients, plus the logged entropy's pass
    f = doc["model_flops"]
    assert f["train"] > 3 * f["forward"] > 0
    assert "function calls" in doc["host_cprofile"]
    assert "| forward_logprobs |" in (tmp_path / "tp.md").read_text()
