"""One prefill forward and backward for each --variant CONFIG, the root's bits beside it: does the variant run at all?

    PYTHONPATH=. timeout -k 5 120 python benchmarks/launch_smoke.py ws=attention.FWD_WS=1 flat=attention.FWD_WS=1,...

A variant that never returns (a warp-specialized loop that deadlocks) would otherwise hold a timed run until its
limit and take the variants after it along. `gpu_pending.sh prefill_ws` runs this first under a short limit and hands
the timing only the variants that came back: the variants run in the order given, each printing one line as it ends
(the seconds its first call took, compiling included, and whether its output and gradients have the root's bits), so
after a limit the first variant without a line is the one that hung. Exit 0 when every variant ran (bits or not: the
timing's gate reports those), 1 when one raised.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tik_kernels  # noqa: E402, F401  (before triton: sets the interpreter up on a CPU machine)
from benchmarks import harness as H  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="+", type=lambda s: H.parse_config_spec(s, ["attention"], "variant"),
                    metavar="NAME=attention.KEY=VALUE[,...]")
    ap.add_argument("--seq", type=int, default=4096)
    args = ap.parse_args()

    import tik_kernels.ops.attention as A

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    S = args.seq if dev == "cuda" else 64
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v, go = (torch.randn(1, h, S, 128, generator=gen, device=dev).to(torch.bfloat16) for h in (32, 8, 8, 32))

    def run() -> list[torch.Tensor]:
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        out = A.attention_prefill(qq, kk, vv)
        out.backward(go)
        return [out.detach(), qq.grad, kk.grad, vv.grad]

    want = run()
    saved = dict(A.CONFIG)
    rc = 0
    for name, over in args.variants:
        A.CONFIG.update(over["attention"])
        t0 = time.perf_counter()
        try:
            got = run()
            if dev == "cuda":
                torch.cuda.synchronize()
            print(f"{name}: ran in {time.perf_counter() - t0:.1f} s, "
                  f"{'the root' if H.tree_bits_equal(got, want) else 'OTHER'} bits", flush=True)
        except Exception as e:  # noqa: BLE001 - the one line names what failed
            print(f"{name}: raised {H.one_line(e)}", flush=True)
            rc = 1
        finally:
            A.CONFIG.clear()
            A.CONFIG.update(saved)
    return rc


if __name__ == "__main__":
    sys.exit(main())
