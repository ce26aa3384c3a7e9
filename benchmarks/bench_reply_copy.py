"""How fast a child's outputs reach its reply (issue #18): a device tensor copied into a fresh shared-memory file's
mapped pages (`protocol.TensorWriter._mapped`), four ways, interleaved over rounds, medians.

    python benchmarks/bench_reply_copy.py [--mb 1024] [--rounds 5] [--out benchmarks/results/reply_copy_<card>.json]

- `plain`: the copy as the writer made it up to session 35 (pages faulted in by the copy);
- `populate`: the pages faulted in first, in one call (`protocol._populate`, MADV_POPULATE_WRITE);
- `register`: the mapping registered with the CUDA driver (cudaHostRegister), the copy one DMA into it;
- `populate_register`: both;
- `pinned` (the bound): into a pinned buffer allocated beforehand, what no reply file can be.
GB/s of each, and the ratio of each to `plain` in the same round.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from tik_kernels.evaluator.protocol import _populate  # noqa: E402


def one(src: torch.Tensor, how: str, pinned: torch.Tensor) -> float:
    n = src.numel()
    if how == "pinned":
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pinned.copy_(src)
        return time.perf_counter() - t0
    fd = os.memfd_create("tik-bench", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, n)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        mm = mmap.mmap(fd, n)
        dst = torch.frombuffer(mm, dtype=torch.uint8, count=n)
        if how.startswith("populate"):
            _populate(mm)
        reg = False
        if how.endswith("register"):
            reg = int(torch.cuda.cudart().cudaHostRegister(dst.data_ptr(), n, 0)) == 0
            if not reg:
                raise RuntimeError("cudaHostRegister refused the mapping")
        dst.copy_(src)
        if reg:
            torch.cuda.cudart().cudaHostUnregister(dst.data_ptr())
        del dst
        mm.close()
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_reply_copy: needs a CUDA device")
    n = a.mb << 20
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    hows = ["plain", "populate", "register", "populate_register", "pinned"]
    secs: dict[str, list[float]] = {h: [] for h in hows}
    errors: dict[str, str] = {}
    one(src, "plain", pinned)  # warm
    for _ in range(a.rounds):
        for h in hows:
            if h in errors:
                continue
            try:
                secs[h].append(one(src, h, pinned))
            except Exception as e:  # noqa: BLE001 (reported, the others go on)
                errors[h] = f"{type(e).__name__}: {e}"
    doc = {"command": " ".join(["python benchmarks/bench_reply_copy.py", *sys.argv[1:]]),
           "device": torch.cuda.get_device_name(), "mb": a.mb, "rounds": a.rounds, "errors": errors,
           "median_s": {h: statistics.median(v) for h, v in secs.items() if v},
           "gb_per_s": {h: n / statistics.median(v) / 1e9 for h, v in secs.items() if v}}
    base = doc["median_s"].get("plain")
    doc["over_plain"] = {h: s / base for h, s in doc["median_s"].items()} if base else {}
    print(json.dumps(doc, indent=1))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
