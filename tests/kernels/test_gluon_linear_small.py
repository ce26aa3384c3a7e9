"""The Gluon small-batch linear (tik_kernels/experimental/gluon_linear_small.py: the product computed transposed, or
with x padded to 64 rows, from a ring of TMA-fed weight tiles) against the linear root, bit for bit, at M = 1, 4, 16
over one chunk, two, six, the narrow-output chunking, and a K that ends inside a chunk and inside a step. GPU only
(Hopper): the interpreter cannot run Gluon. The kernel is an experiment; this says whether each form keeps the
root's tree."""

import pytest
import torch

pytestmark = pytest.mark.gpu

SHAPES = [  # (N, K)
    (6144, 4096),  # qkv: two chunks
    (4096, 12288),  # down: six chunks
    (1024, 2048),  # a small model's o projection: narrow chunks of 1024, two of them
    (3000, 1000),  # one partial chunk, a partial step, a partial row tile
    (151936, 4096),  # lm_head
]


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU (Gluon's wgmma and TMA)")
@pytest.mark.parametrize("M", [1, 4, 16, 64])
@pytest.mark.parametrize("N,K", SHAPES)
def test_gluon_linear_small_has_the_roots_bits(N, K, M):
    from tik_kernels.experimental import gluon_linear_small as g
    from tik_kernels.ops import linear as root

    gen = torch.Generator("cuda").manual_seed(N * 31 + K * 7 + M)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=gen) / K**0.5
    want = root.linear(x, w)
    for stages, swap in ((8, True), (4, True), (None, False)):
        if swap and M > 16:
            continue
        got = g.linear_small(x, w, stages=stages, swap=swap)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (
            f"{'swapped' if swap else 'x padded'}, stages {stages}: {(got != want).sum().item()} of {got.numel()} "
            f"differ, max |diff| {(got.float() - want.float()).abs().max().item()}")
    # twice more: the arrival counters were reset by the launch before
    assert torch.equal(g.linear_small(x, w, swap=M <= 16).view(torch.int16), want.view(torch.int16))
