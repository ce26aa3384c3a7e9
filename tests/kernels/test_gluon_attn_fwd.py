"""The Gluon prefill forward (tik_kernels/experimental/gluon_attn_fwd.py) against the attention root's forward, bit for
bit: o and the log-sum-exp, at lengths that end on a block, inside one, and shorter than one, with GQA groups of 1,
4 and 7, for each of its forms (next blocks loaded early or not, 64 or 128 rows a program). GPU only (Hopper): the
interpreter cannot run Gluon. The kernel is an experiment; this says whether its explicit load schedule keeps the
root's tree."""

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
]


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU (Gluon's wgmma and TMA)")
@pytest.mark.parametrize("prefetch,block_m", [(True, 64), (False, 64), (True, 128)],
                         ids=["prefetch", "own_step", "prefetch_128_rows"])
@pytest.mark.parametrize("B,hq,hk,S", CASES)
def test_gluon_forward_has_the_roots_bits(B, hq, hk, S, prefetch, block_m):
    from tik_kernels.experimental import gluon_attn_fwd as g
    from tik_kernels.ops import attention as root

    gen = torch.Generator("cuda").manual_seed(B * 1000003 + hq * 1009 + S)
    q, k, v = (torch.randn(B, h, S, 128, device="cuda", dtype=torch.bfloat16, generator=gen) * 2
               for h in (hq, hk, hk))
    cu = torch.zeros(1, dtype=torch.int32, device="cuda")
    o_root, lse_root = root._fwd(q, k, v, cu, B, S, S, root._scale(None, 128), False)
    o, lse = g.prefill_forward(q, k, v, prefetch=prefetch, block_m=block_m)
    bad = (o.view(torch.int16) != o_root.view(torch.int16)).any(-1)  # [B, Hq, S]: rows with another bit
    assert not bad.any(), (
        f"o: {bad.sum().item()} of {bad.numel()} rows differ (first [b, h, pos]: {bad.nonzero()[:4].tolist()}; "
        f"positions mod 128 of the first 8: {(bad.nonzero()[:8, 2] % 128).tolist()}), "
        f"max |diff| {(o.float() - o_root.float()).abs().max().item()}")
    assert torch.equal(lse.view(torch.int32), lse_root.view(torch.int32)), (
        f"lse: {(lse != lse_root).sum().item()} differ")
