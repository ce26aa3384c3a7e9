"""How long a candidate child's start would take forked from a warm process instead of started fresh (issue #18):

    python benchmarks/fork_probe.py

A fresh child pays Python, torch, Triton and the harness imports (~1.2 s of CPU on the 2-core machine). A warm trusted
process that has made those imports could fork one per candidate; the fork must still be able to enter new user,
mount, pid and net namespaces (it is single-threaded after fork, which unshare(CLONE_NEWUSER) needs) and run torch.
Prints the import time, the threads the warm process has, and three fork + unshare + torch round trips.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000


def main() -> None:
    t0 = time.perf_counter()
    import torch
    import triton  # noqa: F401

    import tik_kernels.contract  # noqa: F401

    print(f"imports {time.perf_counter() - t0:.2f} s; Python threads {threading.active_count()}, "
          f"OS threads {len(os.listdir('/proc/self/task'))}")
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(3):
        t = time.perf_counter()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            rc = libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET)
            why = os.strerror(ctypes.get_errno()) if rc else "ok"
            x = torch.ones(4) * 2  # torch still works in the fork
            os.write(w, f"unshare {why}, torch {float(x.sum())}".encode())
            os._exit(0)
        os.close(w)
        msg = os.read(r, 200).decode()
        os.waitpid(pid, 0)
        print(f"fork + {msg}: {(time.perf_counter() - t) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
