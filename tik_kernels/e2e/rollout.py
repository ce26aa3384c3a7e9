"""A rollout engine with continuous batching: requests join and leave between decode steps.

Active requests occupy KV-cache slots 0..n-1 (compacted when one leaves, `SlotTable`), so every
decode step is a batch of n tokens whose composition changes from step to step. Each sampled
token's log-probability is recorded as the rollout saw it — the number a trainer would
otherwise recompute.

Decode steps run on static buffers (token ids, positions, sampling seeds in; tokens, log-probs
out; the bf16 weights and the KV cache at fixed addresses), padded up to a batch *bucket*. On
CUDA each (bucket, KV-length bucket) is captured once as a CUDA graph and replayed, so a step
costs one graph launch instead of hundreds of kernel launches from Python; with `graphs=False`
the same padded step runs eagerly (the CPU tests check the bookkeeping that way). Padding rows
sit in free slots (>= n) at position 0: what they write there is overwritten by the prefill of
the request that next takes the slot (or by the copy of its group's prompt, `share_prompts`), and nothing reads it
before.

The host never waits for a step (`overlap`, on by default). What the loop decides between steps (who joins,
who leaves, positions, seeds) follows from token counts alone: a request ends after `max_new` tokens. So
the sampled tokens stay on the device: a step's token ids are the last step's sampled tokens, by slot
(`_tok`, moved with its slot when requests leave, written by a prefill for those that join), and each step's
tokens and log-probs are queued as device copies that the host reads back once, at the end of `generate`.
The host then prepares and launches step t+1 (and a prefill's hundreds of launches) while the device still
runs step t, up to `LEAD` steps ahead. With `overlap=False` it reads every step back before the next (what
the loop did before, kept as the baseline `benchmarks/rollout_profile.py` times it against); the bits are
the same either way: the same kernels on the same inputs in the same order.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from tik_kernels.e2e.model import KVCache, ModelConfig, bf16_weights, forward_decode, forward_packed, to_device

#: the prompt tokens one prefill admits by default (the engine's, `tik e2e`'s, rollout_profile.py's): a GRPO batch's
#: prompts in one prefill. H100, qwen3-0.6b, 256 requests (32 prompts x 8, ~28k prompt tokens): the rollout 0.375 s in
#: one prefill against 0.401 s in four of at most 8192 (prefills 0.075 s against 0.109 s;
#: results/rollout_profile_h100_qwen3-0.6b_prefill{32768,8192}_s31.json)
PREFILL_TOKENS = 32768


@dataclass
class Request:
    prompt: list[int]
    max_new: int
    seed: int
    group: int = 0


@dataclass
class Completion:
    request: Request
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    #: the fp32 log-probs as tensors, bit-exact (floats above are for display)
    logprob_bits: list[torch.Tensor] = field(default_factory=list)
    #: tokens sampled so far, read back or not (`RolloutEngine.generate` fills `tokens` at the end)
    made: int = 0

    def old_logprobs(self) -> torch.Tensor:
        return torch.cat(self.logprob_bits)


def rollout_weights(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The rollout's bf16 weights (`bf16_weights`, no gradient)."""
    return bf16_weights(params, grad=False)


def token_seeds(seeds: list[int], positions: list[int]) -> list[int]:
    """Per-token sampling seed from the request's seed and the token's position (same in every regime)."""
    return [(s * 1_000_003 + p) % (2**31 - 1) for s, p in zip(seeds, positions, strict=True)]


#: decode batch sizes a step is padded up to (the engine's slot count closes the list)
DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def bucket_sizes(max_slots: int, buckets: tuple[int, ...] | list[int] | None = None) -> list[int]:
    """The ascending batch buckets of an engine with `max_slots` slots: those below it, then `max_slots`."""
    return sorted({b for b in (DEFAULT_BUCKETS if buckets is None else buckets) if 0 < b < max_slots} | {max_slots})


def pick_bucket(n: int, sizes: list[int]) -> int:
    """The smallest bucket that holds `n` rows."""
    for b in sizes:
        if b >= n:
            return b
    raise ValueError(f"{n} active requests exceed the largest decode bucket {sizes[-1]}")


def kv_bucket(kv_len: int, capacity: int, floor: int = 64) -> int:
    """The KV length a stock decode step attends over: `kv_len` rounded up to a power of two (at least `floor`),
    at most the cache's capacity, so a graph captured for it serves every shorter context."""
    b = floor
    while b < kv_len:
        b *= 2
    return min(b, capacity)


class SlotTable:
    """Which request holds which KV-cache slot. The decode kernels read cache rows 0..B-1, so the n active
    requests always hold slots 0..n-1: one that leaves is replaced by the last, and `release` returns that
    move for the cache to copy."""

    def __init__(self, n_slots: int):
        self.n_slots = n_slots
        self.holders: list = []

    def __len__(self) -> int:
        return len(self.holders)

    def free(self) -> int:
        return self.n_slots - len(self.holders)

    def admit(self, holder) -> int:
        if not self.free():
            raise ValueError(f"all {self.n_slots} slots are taken")
        self.holders.append(holder)
        return len(self.holders) - 1

    def release(self, slot: int) -> tuple[int, int] | None:
        """Free `slot`; returns (src, dst) when the last holder moved from slot src into it."""
        last = len(self.holders) - 1
        if not 0 <= slot <= last:
            raise ValueError(f"slot {slot} is not held")
        if slot != last:
            self.holders[slot] = self.holders[last]
            self.holders.pop()
            return last, slot
        self.holders.pop()
        return None


@dataclass
class RolloutStats:
    decode_steps: int = 0
    prefills: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    #: the padded size of each decode step (its bucket)
    buckets: list[int] = field(default_factory=list)
    graphs_captured: int = 0
    capture_s: float = 0.0
    #: prompt tokens the prefills computed, and requests whose prompt was another's copy (`share_prompts`)
    prefill_tokens: int = 0
    shared_prompts: int = 0
    #: why decode steps fell back to eager launches (a capture failed), None while graphs work
    graph_error: str | None = None


class RolloutEngine:
    """`graphs`: replay decode steps as CUDA graphs (default: on CUDA). `buckets`: the decode batch sizes a step
    is padded to (default `DEFAULT_BUCKETS` with graphs, else none: each step runs at its exact size).
    `on_token(n)` is called after every prefill and decode step with the tokens generated so far.

    Admission: before each decode step, waiting requests join while slots are free, up to `prefill_tokens` prompt
    tokens in one packed prefill (always at least one request; vLLM's max_num_batched_tokens plays this part) and
    at most `admit_per_step` requests (None: no cap). A prefill is one eager pass over every layer, so its host
    cost is paid per prefill, not per token: on the H200 (qwen3-1.7b, 64 requests of 32-192 prompt tokens) four
    prefills of 16 took 0.20 s of a 0.66 s rollout (`benchmarks/rollout_profile.py`). The default budget takes
    a GRPO batch's prompts in one prefill (`PREFILL_TOKENS`)."""

    def __init__(self, cfg: ModelConfig, backend, *, max_slots: int = 16, max_len: int = 256,
                 admit_per_step: int | None = None, prefill_tokens: int = PREFILL_TOKENS, temperature: float = 1.0,
                 device: str = "cpu", graphs: bool | None = None, buckets: tuple[int, ...] | list[int] | None = None,
                 on_token=None, overlap: bool = True, share_prompts: bool = True):
        self.cfg, self.be, self.device = cfg, backend, device
        self.share_prompts = share_prompts
        self.max_slots, self.max_len, self.temperature = max_slots, max_len, temperature
        self.admit_per_step = admit_per_step or max_slots
        if prefill_tokens < 1:
            raise ValueError(f"prefill_tokens must be at least 1, got {prefill_tokens}")
        self.prefill_tokens = prefill_tokens
        self.graphs = torch.device(device).type == "cuda" if graphs is None else graphs
        if self.graphs and torch.device(device).type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        if buckets is None and not self.graphs:
            self.buckets = list(range(1, max_slots + 1))  # eager: every step at its own size
        else:
            self.buckets = bucket_sizes(max_slots, buckets)
        self.cache = KVCache(cfg, max_slots, max_len, device)
        self.stats = RolloutStats()
        self.on_token = on_token
        self.overlap = overlap
        self._cuda = torch.device(device).type == "cuda"
        # static decode buffers: their addresses are baked into the captured graphs
        self.W: dict[str, torch.Tensor] | None = None
        self._inp = torch.zeros(3, max_slots, dtype=torch.int64, device=device)  # ids, positions, seeds
        # the sampled tokens and their log-probs, by slot: a step's results, and (tokens) the next step's ids
        self._tok = torch.zeros(max_slots, dtype=torch.int64, device=device)
        self._lp = torch.zeros(max_slots, dtype=torch.float32, device=device)
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._lead: deque = deque()  # an event per step in flight (CUDA), oldest first

    # ------------------------------------------------------------------ decode step

    def load_weights(self, params: dict[str, torch.Tensor]) -> None:
        """Copy the fp32 master weights into the static bf16 buffers (`rollout_weights`: the same rounding as
        `bf16_weights`)."""
        with torch.no_grad():
            if self.W is None:
                self.W = rollout_weights(params)
                return
            # one multi-tensor copy (on CUDA one launch, not one a weight; a tied lm_head is the embed buffer itself)
            same = [k for k in params if k in self.W]
            torch._foreach_copy_([self.W[k] for k in same], [params[k].detach() for k in same])

    def _kv_len(self, kv_len: int) -> int:
        """The KV length a step of contexts up to `kv_len` attends over: for a backend that reads only the
        first kv_len cache entries (stock SDPA), a bucket when graphs need a fixed shape; the capacity for one
        whose launch depends on the capacity alone (the unified kernel)."""
        if not getattr(self.be, "decode_reads_kv_len", True):
            return self.max_len
        return kv_bucket(kv_len, self.max_len) if self.graphs else kv_len

    def _step(self, b: int, kv: int) -> None:
        """The decode step over rows 0..b-1 of the static buffers, results into `_tok` / `_lp`."""
        ids, pos, seeds = self._inp[0, :b], self._inp[1, :b], self._inp[2, :b]
        hidden = forward_decode(self.cfg, self.be, self.W, ids, pos, self.cache, kv_len=kv)
        tok, lp = self.be.sample_logprob(hidden, self.W["lm_head"], self.temperature, seeds)
        self._tok[:b].copy_(tok)
        self._lp[:b].copy_(lp)

    def _capture(self, b: int, kv: int) -> torch.cuda.CUDAGraph:
        """Capture the step at (b, kv) with the current inputs. A decode step is idempotent (it writes the k/v of
        its tokens, then reads them), so the warm-up runs that precede the capture (Triton compiles, cuBLAS
        workspaces) change nothing the replay would not. The steps queued before it are waited for first: their
        device time is rollout, not the capture's (`capture_s`, which `run_mode` leaves out of a step's time)."""
        torch.cuda.synchronize()
        t = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(b, kv)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        g = torch.cuda.CUDAGraph()
        # every graph writes its results to the engine's buffers and keeps nothing alive in the shared pool,
        # so the graphs can share it whatever order they replay in
        with torch.cuda.graph(g, pool=self._pool):
            self._step(b, kv)
        torch.cuda.synchronize()  # the warm-up runs' GPU time belongs to the capture, not to the step after it
        self.stats.graphs_captured += 1
        self.stats.capture_s += time.perf_counter() - t
        return g

    def _launch(self, n: int, positions: list[int], seeds: list[int]) -> None:
        """Queue the decode step of the requests in slots 0..n-1, their token ids the tokens in `_tok[:n]`
        (device), its results into `_tok` / `_lp`; returns without waiting for the device."""
        b = pick_bucket(n, self.buckets)
        kv = self._kv_len(max(positions) + 1)
        pad = [0] * (self.max_slots - n)
        # positions and seeds from the host, whole rows (one contiguous copy; a fresh pinned tensor each step, which
        # the caching host allocator keeps until its copy has run), the ids from the device; rows past b are not
        # read by a step of b rows
        stage = torch.tensor([positions + pad, seeds + pad], dtype=torch.int64)
        if self._cuda:
            stage = stage.pin_memory()
        self._inp[1:].copy_(stage, non_blocking=True)
        self._inp[0, :n].copy_(self._tok[:n])
        if b > n:
            self._inp[0, n:b].zero_()
        g = self._graphs.get((b, kv)) if self.graphs else None
        if self.graphs and g is None:
            try:
                g = self._graphs[(b, kv)] = self._capture(b, kv)
            except RuntimeError as e:
                # a step that cannot be captured (an op that waits on the GPU) still runs: eagerly, and says so
                self.graphs, self.stats.graph_error = False, " ".join(str(e).split())[:300]
                print(f"rollout: decode step not captured as a CUDA graph, running eagerly: {self.stats.graph_error}",
                      file=sys.stderr)
        if g is not None:
            g.replay()
        else:
            self._step(b, kv)
        self.stats.batch_sizes.append(n)
        self.stats.buckets.append(b)

    def _move_slot(self, src: int, dst: int) -> None:
        """A request moves from slot `src` to `dst` (`SlotTable.release`): its KV cache, and its last sampled token,
        the id of its next step."""
        self.cache.move(src, dst)
        self._tok[dst] = self._tok[src]

    def _queue_step(self, n: int, positions: list[int], seeds: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step as `generate` runs it: launched (`_launch`), its tokens and log-probs copied aside on the
        device (the next step overwrites `_tok` / `_lp`), the host then held to LEAD steps ahead (`_bound_lead`)."""
        self._launch(n, positions, seeds)
        out = self._tok[:n].clone(), self._lp[:n].clone()
        self._bound_lead()
        return out

    def _bound_lead(self) -> None:
        """Let the host run at most LEAD steps ahead of the device (the progress it reports stays near the truth,
        and the queue of launches stays short)."""
        if not self._cuda:
            return
        ev = torch.cuda.Event()
        ev.record()
        self._lead.append(ev)
        while len(self._lead) > LEAD:
            self._lead.popleft().synchronize()

    def decode(self, ids: list[int], positions: list[int], seeds: list[int]) -> tuple[list[int], torch.Tensor]:
        """One decode step for the requests in slots 0..n-1, waited for: their sampled tokens (host) and
        log-probs (device). What one step of `generate` costs with `overlap=False` (`decode_bench`)."""
        return self._finish_decode(self._start_decode(ids, positions, seeds))

    def _start_decode(self, ids: list[int], positions: list[int], seeds: list[int]) -> int:
        """`decode`'s host part: the ids copied in, the step launched; returns without waiting (`decode_bench` times
        it apart from the wait, to see what of a waited-for step is the host's)."""
        n = len(ids)
        src = torch.tensor(ids, dtype=torch.int64)
        self._tok[:n].copy_(src.pin_memory() if self._cuda else src, non_blocking=True)
        self._launch(n, positions, seeds)
        return n

    def _finish_decode(self, n: int) -> tuple[list[int], torch.Tensor]:
        """`decode`'s wait: the step's tokens read back (host), its log-probs copied aside (device)."""
        lp = self._lp[:n].clone()
        return self._tok[:n].tolist(), lp

    def _prefill(self, joining: list[Completion], taken: list[int], lens: list[int]) -> torch.Tensor:
        """One packed prefill of the joining requests' prompts into their slots `taken`; the hidden state of each
        one's last prompt token (the row its first token is sampled from), in `joining`'s order.

        With `share_prompts`, requests with the same prompt (a GRPO group: n samples of one prompt) share one
        prefill: only the first of them is computed, into its slot, and the others' slots get a copy of its keys
        and values (`KVCache.copy_prefix`) and its last row. The kernels' results do not depend on what else is in
        the batch (TIK's contract), so every slot holds the bits its own prefill would have written, and every
        token sampled from it is the one it would have been; a stock backend's prefill may differ with the batch,
        so there the shared prompt is one of the values its separate prefills could have had."""
        cfg, be, W = self.cfg, self.be, self.W
        first: dict[tuple, int] = {}
        src = [first.setdefault(tuple(c.request.prompt), i) if self.share_prompts else i
               for i, c in enumerate(joining)]
        uniq = [i for i, s in enumerate(src) if s == i]
        ulens = [lens[i] for i in uniq]
        ids = to_device([t for i in uniq for t in joining[i].request.prompt], self.device)
        cu = to_device([0, *itertools.accumulate(ulens)], self.device, torch.int32)
        hidden = forward_packed(cfg, be, W, ids, cu, self.cache, [taken[i] for i in uniq], ulens)
        last = hidden.index_select(0, (cu[1:] - 1).long())
        self.stats.prefill_tokens += sum(ulens)
        if len(uniq) == len(joining):
            return last
        dup = [i for i, s in enumerate(src) if s != i]
        self.cache.copy_prefix([taken[src[i]] for i in dup], [taken[i] for i in dup], [lens[i] for i in dup])
        self.stats.shared_prompts += len(dup)
        row = {u: r for r, u in enumerate(uniq)}
        return last.index_select(0, to_device([row[s] for s in src], self.device))

    # ------------------------------------------------------------------ the loop

    @torch.no_grad()
    def generate(self, params: dict[str, torch.Tensor], requests: list[Request]) -> list[Completion]:
        self.load_weights(params)
        W, be = self.W, self.be
        for r in requests:
            if len(r.prompt) + r.max_new > self.max_len:
                raise ValueError(f"request of {len(r.prompt)}+{r.max_new} tokens exceeds max_len {self.max_len}")
        waiting = deque(Completion(r) for r in requests)
        slots = SlotTable(self.max_slots)  # slots.holders[j]: the Completion in cache slot j
        done: list[Completion] = []
        # what the device produced, not read back yet: (tokens, log-probs, the completions they belong to)
        pending: list[tuple[torch.Tensor, torch.Tensor, list[Completion]]] = []
        made = 0

        def produced(comps: list[Completion], tok: torch.Tensor, lp: torch.Tensor) -> None:
            nonlocal made
            pending.append((tok, lp, comps))
            for c in comps:
                c.made += 1
            made += len(comps)
            if not self.overlap:
                read_back(pending)
            if self.on_token:
                self.on_token(made)

        def retire() -> None:
            j = 0
            while j < len(slots):
                c = slots.holders[j]
                if c.made >= c.request.max_new:
                    done.append(c)
                    move = slots.release(j)
                    if move:
                        self._move_slot(*move)
                else:
                    j += 1

        while waiting or len(slots):
            joining, budget, seen = [], self.prefill_tokens, set()
            while waiting and len(joining) < min(slots.free(), self.admit_per_step):
                key = tuple(waiting[0].request.prompt)
                cost = 0 if self.share_prompts and key in seen else len(key)  # a shared prompt is prefilled once
                if joining and cost and cost > budget:  # a copy joins even after a first prompt over the budget
                    break
                budget -= cost
                seen.add(key)
                joining.append(waiting.popleft())
            if joining:
                taken = [slots.admit(c) for c in joining]  # consecutive: slots are taken from len(slots) on
                lens = [len(c.request.prompt) for c in joining]
                last = self._prefill(joining, taken, lens)
                pos = [n - 1 for n in lens]
                seeds = to_device(token_seeds([c.request.seed for c in joining], pos), self.device)
                tok, lp = be.sample_logprob(last, W["lm_head"], self.temperature, seeds)
                assert taken == list(range(taken[0], taken[0] + len(taken)))
                self._tok[taken[0]:taken[-1] + 1] = tok
                produced(joining, tok.clone(), lp.clone())
                self.stats.prefills += 1
                retire()
            if not len(slots):
                continue
            active = list(slots.holders)
            positions = [len(c.request.prompt) + c.made - 1 for c in active]
            produced(active, *self._queue_step(len(active), positions,
                                               token_seeds([c.request.seed for c in active], positions)))
            self.stats.decode_steps += 1
            retire()
        read_back(pending)
        self._lead.clear()
        order = {id(r): i for i, r in enumerate(requests)}
        return sorted(done, key=lambda c: order[id(c.request)])


#: how many decode steps the host may queue ahead of the device (`RolloutEngine._bound_lead`)
LEAD = 4


def read_back(pending: list[tuple[torch.Tensor, torch.Tensor, list[Completion]]]) -> None:
    """Append the queued results to their completions, in the order they were produced, and empty the queue: one
    read-back of every token and log-prob (it waits for the device), one gather of each completion's log-probs."""
    if not pending:
        return
    toks = torch.cat([t for t, _, _ in pending]).tolist()
    lps = torch.cat([lp for _, lp, _ in pending])
    lps_host = lps.tolist()
    where: dict[int, list[int]] = {}  # a completion's rows of `lps`, in order
    comps: dict[int, Completion] = {}
    i = 0
    for _, _, cs in pending:
        for c in cs:
            c.tokens.append(toks[i])
            c.logprobs.append(lps_host[i])
            where.setdefault(id(c), []).append(i)
            comps[id(c)] = c
            i += 1
    order = [r for rows in where.values() for r in rows]
    bits = lps.index_select(0, torch.tensor(order, dtype=torch.int64).to(lps.device)).split(
        [len(rows) for rows in where.values()])
    for key, part in zip(where, bits, strict=True):
        comps[key].logprob_bits.append(part)
    pending.clear()
