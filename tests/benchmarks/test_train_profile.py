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


def test_a_variant_is_timed_beside_the_base_with_its_config_and_restores_it(tmp_path, monkeypatch):
    """--variant times the updates again under other CONFIG values, on its own parameters, in the same rounds; the
    CONFIG is back afterwards, and the values reach the kernels' launches while the variant runs."""
    import tik_kernels.ops.add_rmsnorm as AR

    seen = []
    bwd = AR.add_rmsnorm_bwd
    monkeypatch.setattr(AR, "add_rmsnorm_bwd", lambda *a: seen.append(AR.CONFIG["BWD_ROWS"]) or bwd(*a))
    before = dict(AR.CONFIG)
    assert TP.main(["--preset", "tiny", "--prompts", "2", "--group", "2", "--prompt-len", "3", "5", "--answer-len",
                    "2", "3", "--slots", "4", "--minibatches", "2", "--rounds", "2", "--out", str(tmp_path),
                    "--name", "tp", "--variant", "rows32=add_rmsnorm.BWD_ROWS=32"]) == 0
    assert AR.CONFIG == before
    doc = json.loads((tmp_path / "tp.json").read_text())
    assert len(doc["samples_s"]["train[rows32]"]) == 2
    assert "| train[rows32] |" in (tmp_path / "tp.md").read_text()
    assert 32 in seen and before["BWD_ROWS"] in seen


def test_a_bad_variant_is_one_line(capsys):
    import pytest

    with pytest.raises(SystemExit):
        TP.main(["--variant", "x=add_rmsnorm.NO_SUCH_KEY=1"])
    assert "add_rmsnorm has no CONFIG key NO_SUCH_KEY" in capsys.readouterr().err
