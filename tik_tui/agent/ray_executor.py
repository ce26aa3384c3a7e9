"""The `ray` executor: each evaluation a Ray task on an existing cluster (`tik search --executor ray`).

A task asks for one GPU (`num_gpus=1`; Ray pins it with CUDA_VISIBLE_DEVICES, which the
evaluator's sandbox passes on to the candidate's child), or one CPU on a cluster without GPUs
(the interpreter). The job carries the sources, so nodes need only this package installed
(`pip install -e .` of the same checkout), not the workspace. `ray` is imported only here,
and only when asked for: a missing package or an unreachable address is an `ExecutorError`.
Ray never retries on its own (`max_retries=0`): a lost worker or node comes back as
`Outcome.lost` and the search retries it once, as for a local evaluator process.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from tik_tui.agent.jobs import EvalJob, ExecutorError, Outcome, one_line, run_job


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ExecutorError("--executor ray needs the ray package: pip install 'tik[ray]' (or pip install ray)") \
            from None
    return ray


def _resolve_address(address: str | None) -> str:
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ExecutorError("--executor ray needs --address ADDR (host:port of a running Ray cluster's head, "
                            "or ray://host:port)")
    return address


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """A TCP connect to host:port first: ray.init on an unreachable address retries for minutes."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ExecutorError(f"bad Ray address {address!r} (expected host:port or ray://host:port)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ExecutorError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


#: Ray exceptions that mean the process (or node) running the job is gone, not that the job failed
_LOST = ("WorkerCrashedError", "NodeDiedError", "LocalRayletDiedError", "ObjectLostError", "OwnerDiedError",
         "RaySystemError", "ActorDiedError", "ActorUnavailableError")


def _ray_task(job: EvalJob, evaluate: Callable | None) -> Outcome:
    import ray

    gpus = ray.get_gpu_ids()
    where = {"executor": "ray", "node": ray.util.get_node_ip_address(), "gpu": ",".join(map(str, gpus)) or None}
    return run_job(job, evaluate, where)


class RayExecutor:
    """Each job a Ray task (one GPU, or one CPU on a CPU-only cluster) on an existing cluster."""

    name = "ray"

    def __init__(self, address: str | None, *, evaluate: Callable | None = None, device: str | None = None,
                 workers: int | None = None):
        ray = _import_ray()
        self.ray = ray
        self.address = address
        self._owns = not ray.is_initialized()
        if self._owns:
            address = _resolve_address(address)
            check_reachable(address)
            try:
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            except Exception as e:
                raise ExecutorError(f"cannot connect to the Ray cluster at {address}: {one_line(e)}"[:300]) from None
        res = ray.cluster_resources()
        gpus, cpus = int(res.get("GPU", 0)), int(res.get("CPU", 0))
        self.device = device or ("cuda" if gpus else "cpu")
        if self.device.startswith("cuda") and not gpus:
            self.close()
            raise ExecutorError(f"the Ray cluster at {self.address} has no GPU (use --device cpu to evaluate "
                                "in the interpreter)")
        cuda = self.device.startswith("cuda")
        opts = {"num_gpus": 1} if cuda else {"num_cpus": 1}
        self.slots = int(workers or max(1, gpus if cuda else cpus))
        self.evaluate = evaluate
        # a fresh worker process per GPU task (max_calls=1, Ray's default for GPU tasks, made explicit): the
        # evaluator's own process also computes on the GPU (timed outputs' reference), and a process reused for a
        # task on another GPU would still hold its first one, next to someone else's timing.
        # Retries are the search's (once, visibly), never Ray's own.
        remote = ray.remote(max_calls=1 if cuda else 0)(_ray_task)
        self._remote = remote.options(max_retries=0, retry_exceptions=False, **opts)
        self._refs: dict[Any, Future] = {}
        self._lost = tuple(getattr(ray.exceptions, n) for n in _LOST if hasattr(ray.exceptions, n))

    def _outcome(self, exc: BaseException, t0: float) -> Outcome:
        rx = self.ray.exceptions
        where = {"executor": "ray", "started": t0, "finished": time.time()}
        cause = getattr(exc, "cause", None) if isinstance(exc, rx.RayTaskError) else exc
        if isinstance(exc, self._lost) or isinstance(cause, self._lost):
            return Outcome(lost=f"Ray worker lost: {one_line(exc)}"[:300], worker=where)
        return Outcome(error=f"Ray task failed: {one_line(cause or exc)}"[:300], worker=where)

    def submit(self, job: EvalJob) -> Future:
        t0 = time.time()
        out: Future = Future()
        try:
            ref = self._remote.remote(job, self.evaluate)
        except Exception as e:  # e.g. the evaluator cannot be serialized
            out.set_result(self._outcome(e, t0))
            return out
        self._refs[ref] = out

        def resolved(f: Future) -> None:
            self._refs.pop(ref, None)
            try:
                res = f.result()
                out.set_result(res if isinstance(res, Outcome) else Outcome(error="Ray task returned no outcome"))
            except BaseException as e:
                out.set_result(self._outcome(e, t0))

        ref.future().add_done_callback(resolved)
        return out

    def describe(self) -> dict:
        return {"executor": "ray", "address": self.address, "workers": self.slots, "device": self.device}

    def close(self) -> None:
        for ref in list(self._refs):
            try:
                self.ray.cancel(ref, force=True)
            except Exception:
                pass
        if self._owns and self.ray.is_initialized():
            self.ray.shutdown()


def check_cluster(address: str | None) -> None:
    """What the command line checks before it starts anything: ray importable, the address reachable."""
    _import_ray()
    check_reachable(_resolve_address(address))
