"""The warp-specialized Gluon prefill forward (tik_kernels/experimental/gluon_attn_fwd_ws.py: a producer warp and two
consumer warpgroups) against the attention root's forward, bit for bit: o and the log-sum-exp, at the shapes of
test_gluon_attn_fwd.py (lengths on, inside and below a block; GQA 1, 4, 7; an odd number of row tiles, so a program's
second tile lies past the end). GPU only (Hopper). A module of its own: a warp-specialized kernel that waits on a
barrier nobody arrives at hangs, so `gpu_pending.sh gluon_fwd_ws` runs it apart from the other forms."""

import pytest
import torch

pytestmark = pytest.mark.gpu

CASES = [  # (B, Hq, Hk, S): test_gluon_attn_fwd.py's, and one tile's worth of rows, alone in its program
    (1, 32, 8, 1024),
    (2, 32, 8, 1000),
    (1, 28, 4, 4096),
    (3, 8, 8, 300),
    (2, 16, 4, 77),
    (1, 32, 8, 16384),
    (1, 8, 8, 64),
]


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU (Gluon's wgmma, TMA and warp specialization)")
@pytest.mark.parametrize("B,hq,hk,S", CASES)
def test_warp_specialized_forward_has_the_roots_bits(B, hq, hk, S):
    from tik_kernels.experimental import gluon_attn_fwd_ws as ws
    from tik_kernels.ops import attention as root

    gen = torch.Generator("cuda").manual_seed(B * 1000003 + hq * 1009 + S)
    q, k, v = (torch.randn(B, h, S, 128, device="cuda", dtype=torch.bfloat16, generator=gen) * 2
               for h in (hq, hk, hk))
    cu = torch.zeros(1, dtype=torch.int32, device="cuda")
    o_root, lse_root = root._fwd(q, k, v, cu, B, S, S, root._scale(None, 128), False)
    o, lse = ws.prefill_forward(q, k, v)
    bad = (o.view(torch.int16) != o_root.view(torch.int16)).any(-1)
    assert not bad.any(), (
        f"o: {bad.sum().item()} of {bad.numel()} rows differ (first [b, h, pos]: {bad.nonzero()[:4].tolist()}), "
        f"max |diff| {(o.float() - o_root.float()).abs().max().item()}")
    assert torch.equal(lse.view(torch.int32), lse_root.view(torch.int32)), (
        f"lse: {(lse != lse_root).sum().item()} differ")
