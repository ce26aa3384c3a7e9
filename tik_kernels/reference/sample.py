"""Float64 reference of `sample`: seeded Gumbel-max, and the noise function that defines it. Frozen.

The noise is part of the operator's specification, so that the same seed gives the same token in
every implementation, every batch and every derivation. For a token with seed s (int64) and a
vocabulary entry v, with all arithmetic on uint32 (wrapping):

    fmix32(x)  = murmur3 finalizer: x ^= x >> 16; x *= 0x85EBCA6B; x ^= x >> 13; x *= 0xC2B2AE35; x ^= x >> 16
    key(s)     = fmix32(lo32(s) + fmix32(hi32(s) ^ 0x6A09E667))
    bits(s, v) = fmix32(fmix32(v * 0x9E3779B1 + key(s)) ^ key(s))
    u(s, v)    = (2 · (bits >> 9) + 1) · 2^-24          exactly representable in fp32, in (0, 1)
    g(s, v)    = −log(−log u)                           standard Gumbel (truncated to [−2.8, 16.6])

sample = argmax_v (logits_v / temperature + g(s, v)), ties to the lowest v; temperature 0 is greedy
argmax_v logits_v (no noise). The argmax of logits/τ + Gumbel noise is an exact draw from
softmax(logits/τ) (the Gumbel-max trick); the truncation of u to 23 bits changes probabilities by
at most ~2^-23 relative.
"""

from __future__ import annotations

import torch

from tik_kernels.reference.logprob import logits as _logits

M32 = 0xFFFFFFFF


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """a · c mod 2^32 for 0 ≤ a < 2^32 in int64 without overflow: split c into 16-bit halves."""
    lo = a * (c & 0xFFFF)
    hi = ((a * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & M32


def fmix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def seed_key(seeds: torch.Tensor) -> torch.Tensor:
    s = seeds.to(torch.int64)
    lo, hi = s & M32, (s >> 32) & M32
    return fmix32((lo + fmix32(hi ^ 0x6A09E667)) & M32)


def noise_bits(seeds: torch.Tensor, V: int) -> torch.Tensor:
    """bits(s, v) as int64 [T, V] (values in [0, 2^32))."""
    key = seed_key(seeds)[:, None]
    v = torch.arange(V, dtype=torch.int64, device=seeds.device)[None, :]
    x = fmix32((_mul32(v, 0x9E3779B1) + key) & M32)
    return fmix32(x ^ key)


def uniform(seeds: torch.Tensor, V: int) -> torch.Tensor:
    """u(s, v), float64 [T, V]: the exact fp32 value the kernel uses."""
    return ((noise_bits(seeds, V) >> 9) * 2 + 1).double() * 2.0**-24


def gumbel(seeds: torch.Tensor, V: int) -> torch.Tensor:
    """g(s, v) = −log(−log u(s, v)), float64 [T, V]."""
    return -torch.log(-torch.log(uniform(seeds, V)))


def scores(hidden: torch.Tensor, w: torch.Tensor, temperature: float, seeds: torch.Tensor) -> torch.Tensor:
    """The float64 quantity sample() maximizes: logits/τ + g for τ > 0, plain logits for τ = 0."""
    z = _logits(hidden, w, temperature)
    if temperature == 0:
        return z.to(hidden.device)
    return (z + gumbel(seeds.to(z.device), w.shape[0])).to(hidden.device)


def sample(hidden: torch.Tensor, w: torch.Tensor, temperature: float, seeds: torch.Tensor) -> torch.Tensor:
    """Seeded Gumbel-max token ids, int64 [T] (torch.argmax returns the first maximum)."""
    return scores(hidden, w, temperature, seeds).argmax(-1)
