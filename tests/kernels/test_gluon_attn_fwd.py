"""The Gluon prefill forwards (tik_kernels/experimental/gluon_attn_fwd.py and, warp-specialized, gluon_attn_fwd_ws.py)
against the attention root's forward, bit for bit: o and the log-sum-exp, at lengths that end on a block, inside one,
and shorter than one, with GQA groups of 1, 4 and 7, an odd number of row tiles (a warp-specialized program's second
tile past the end), for each form (next blocks loaded early or not, 64 or 128 rows a program, a producer warp and two
consumer warpgroups). GPU only (Hopper): the interpreter cannot run Gluon. The kernels are experiments; this says
whether their explicit schedules keep the root's tree. A warp-specialized kernel that waits on a barrier nobody
arrives at hangs, so `gpu_pending.sh` runs its cases apart (`-k warp_specialized`, and `-k "not warp_specialized"`)."""

import pytest
import torch

pytestmark = pytest.mark.gpu

CASES = [  # (B, Hq, Hk, S)
    (1, 32, 8, 1024),
    (2, 32, 8, 1000),
    (1, 28, 4, 4096),
    (3, 8, 8, 300),
    (2, 16, 4, 77),
    (1, 32, 8, 16384),
    (1, 8, 8, 64),
]
#: the forms: the module, then prefill_forward's keywords
FORMS = {
    "prefetch": ("gluon_attn_fwd", {}),
    "own_step": ("gluon_attn_fwd", {"prefetch": False}),
    "prefetch_128_rows": ("gluon_attn_fwd", {"block_m": 128}),
    "warp_specialized": ("gluon_attn_fwd_ws", {}),
}


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU (Gluon's wgmma, TMA and warp specialization)")
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("B,hq,hk,S", CASES)
def test_gluon_forward_has_the_roots_bits(B, hq, hk, S, form):
    import importlib

    from tik_kernels.ops import attention as root

    module, keywords = FORMS[form]
    forward = importlib.import_module(f"tik_kernels.experimental.{module}").prefill_forward
    gen = torch.Generator("cuda").manual_seed(B * 1000003 + hq * 1009 + S)
    q, k, v = (torch.randn(B, h, S, 128, device="cuda", dtype=torch.bfloat16, generator=gen) * 2
               for h in (hq, hk, hk))
    cu = torch.zeros(1, dtype=torch.int32, device="cuda")
    o_root, lse_root = root._fwd(q, k, v, cu, B, S, S, root._scale(None, 128), False)
    o, lse = forward(q, k, v, **keywords)
    bad = (o.view(torch.int16) != o_root.view(torch.int16)).any(-1)  # [B, Hq, S]: rows with another bit
    assert not bad.any(), (
        f"o: {bad.sum().item()} of {bad.numel()} rows differ (first [b, h, pos]: {bad.nonzero()[:4].tolist()}; "
        f"positions mod 128 of the first 8: {(bad.nonzero()[:8, 2] % 128).tolist()}), "
        f"max |diff| {(o.float() - o_root.float()).abs().max().item()}")
    assert torch.equal(lse.view(torch.int32), lse_root.view(torch.int32)), (
        f"lse: {(lse != lse_root).sum().item()} differ")
