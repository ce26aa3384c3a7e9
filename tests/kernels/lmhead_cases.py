"""What the tests of the two lm_head roots (logprob, entropy) share: the root as its own copy of the lm_head pieces,
tiles small enough to give several chunks, blocks and K steps at CPU sizes, and a one-config CPU plan."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from plant import own_copy, planted

from tik_kernels.contract import Plan, tokenwise_plan
from tik_kernels.contracts._lmhead import CPU_SIZES

#: tiny tiles: several V chunks, K steps and token blocks even at CPU sizes
SMALL = {"BLOCK_T": 16, "BLOCK_V": 16, "BLOCK_K": 16, "V_CHUNK": 48,
         "BWD_CHUNK_T": 16, "BWD_BLOCK_M": 16, "BWD_BLOCK_N": 16, "BWD_BLOCK_K": 16}


class LmheadRoot:
    """One lm_head root's source, with the pieces it shares (ops/_lmhead.py) as its own copy, so a planted edit can
    reach them; `planted` loads it with edits and a CONFIG update, `plan` is the contract's CPU plan of one config."""

    def __init__(self, op: str, module, configs):
        self.op = op
        self.src = own_copy(Path(module.__file__).read_text(), "tik_kernels.ops._lmhead")
        self.configs = configs

    def planted(self, tmp_path: Path, *edits: tuple[str, str], config: dict | None = None):
        return planted(tmp_path, self.src, f"planted_{self.op}", *edits, config=config)

    def plan(self, grad: bool = False, sizes=CPU_SIZES, cfg=None) -> Plan:
        cfg = cfg or self.configs("cpu")[0]
        if not grad:
            cfg = dataclasses.replace(cfg, grad_args=())
        return tokenwise_plan(self.op, [cfg], sizes, seed=5)
