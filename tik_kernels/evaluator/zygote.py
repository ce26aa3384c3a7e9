"""The fork server's process in the jail: `python -m tik_kernels.evaluator.zygote FD`, started by `forkserver`.

A candidate child started the usual way (`sandbox._popen`) pays a fresh interpreter: Python, torch, Triton and the
harness imported again, ~1.2 s of CPU on the 2-core machine, for every candidate. This process pays that once. It is
started like any child (the same launcher, jail, mounts, scrubbed environment and uid: `isolate.py`), with one more
read-write mount, its pool (/tik/pool), where the evaluator creates the directories of the children it asks for. It
imports what a child imports before its job, then serves requests on FD (a socket pair with the evaluator) and never
runs anything else: no candidate code, no kernel, no CUDA call (a forked CUDA context is unusable). Each request names
a directory of the pool and brings the child's stdout and stderr; the answer is the child's status pipe and a pidfd.

One request, three processes (the shape of `isolate.jail`, nested in this jail):

    zygote (this process; its pid namespace, user namespace and mounts are the base jail's)
      └ holder: fork; unshare(user, mount, pid, net, ipc, uts), its own uid/gid map (one id: this process's), then
          the candidate's mounts: its scratch at /tmp and its implementation directory read-only at /tik/impl (both
          from the pool), an empty read-only tmpfs over /tik/pool (no other child's directory is in sight), a fresh
          /dev/shm. Reports the child's wait status on the status pipe, or `E<why>` when it could not build this.
          └ init: pid 1 of the new pid namespace: a fresh /proc, then waits for the child
              └ child: every inherited descriptor but 0-2 closed, no capabilities (bounding set, permitted, effective,
                ambient), no_new_privs, the request's environment; runs `child.main` without exec

Each link dies with its parent (PR_SET_PDEATHSIG; init also checks the holder is still there once the signal is
armed), and init's end kills its whole pid namespace: killing the holder (the evaluator's pidfd) kills the child and
everything it started. The child is the user of the base jail, in a user namespace of its own, without capabilities:
it cannot unmount what hides the pool (the mounts it inherited are locked together), see the zygote or another child
(other pid namespaces), reach the zygote's socket (closed in the holder) or share memory, IPC or network with
another child. What it inherits from the zygote's memory is what the zygote imported: public code, a scrubbed
environment, the request that started it.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import re
import select
import signal
import socket
import sys
import time
import traceback

from tik_kernels.evaluator import isolate
from tik_kernels.evaluator.isolate import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    SETUP_FAILED,
    SetupError,
    libc,
    mount,
    prctl,
)

#: where the pool is in the jail, and where a child's directories go
POOL, SCRATCH, IMPL = "/tik/pool", "/tmp", "/tik/impl"
#: a pool directory's name: what `sandbox.owned_tempdir` makes (tik-<kind>-<pid>.<start>-<random>), one component
NAME = re.compile(r"^tik-[a-z-]+-\d+\.\d+-[A-Za-z0-9_]+$")
#: the largest request (the child's environment is most of it)
MAX_REQUEST = 1 << 20
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """No capability left in any set: the bounding set (what an exec could regain), ambient, then permitted and
    effective (capset). A child started by the launcher loses them by exec'ing as a non-root uid; this one does not
    exec, so it drops them itself."""
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            break  # past the kernel's last capability
    libc.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0)
    header, data = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise SetupError(f"capset: {os.strerror(ctypes.get_errno())}")


def _remount(point: str, read_only: bool) -> None:
    """Remount the topmost mount at `point` nosuid, nodev (read-only if asked), keeping the per-mount flags it had
    (a flag inherited from the base jail is locked: dropping it is refused)."""
    opts = [o for p, o in isolate._mounts_under(point) if p == point][-1]
    isolate.remount(point, opts, MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0))


def _enter(name: str) -> None:
    """The holder's namespaces and the child's mounts (see the module doc)."""
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) != 0:
        raise SetupError(f"unshare: {os.strerror(ctypes.get_errno())}")
    for what, data in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{what}", "w") as f:
            f.write(data)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount(f"{POOL}/{name}/scratch", SCRATCH, None, MS_BIND)
    _remount(SCRATCH, read_only=False)
    mount(f"{POOL}/{name}/impl", IMPL, None, MS_BIND | MS_REC)
    _remount(IMPL, read_only=True)
    isolate.fresh_shm("/dev/shm")
    mount("tmpfs", POOL, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k")


def _child(request: dict) -> None:
    """Become the candidate's child (never returns)."""
    code = 1
    try:
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        isolate.die_with_parent()
        drop_capabilities()
        prctl(isolate.PR_SET_NO_NEW_PRIVS, 1)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = [sys.argv[0], SCRATCH]
        from tik_kernels.evaluator import child

        code = child.main(sys.argv) or 0
    except SystemExit as e:  # what `python -m tik_kernels.evaluator.child` would have printed and exited with
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:
            sys.stderr.write(f"{e.code}\n")
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _init(request: dict, holder_alive: int, report: int) -> None:
    """pid 1 of the child's pid namespace (never returns): its /proc, the child, the child's wait status."""
    try:
        isolate.die_with_parent()
        # the holder may have died before the line above: then its end of the pipe is closed, and nothing starts
        if select.select([holder_alive], [], [], 0)[0]:
            os._exit(SETUP_FAILED)
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        os.chdir(request["cwd"])
    except (SetupError, OSError) as e:
        os.write(report, f"E{_why(e)}".encode())
        os._exit(SETUP_FAILED)
    pid = os.fork()
    if pid == 0:
        _child(request)
    while True:
        got, status = os.wait()
        if got == pid:
            os.write(report, f"S{status}".encode())
            os._exit(0)


def _holder(name: str, request: dict, status_w: int) -> None:
    """The holder (never returns): namespaces and mounts, init, then the child's status on `status_w`."""
    try:
        _enter(name)
        alive_r, alive_w = os.pipe()
        report_r, report_w = os.pipe()
    except (SetupError, OSError) as e:
        _fail(status_w, _why(e))
    init = os.fork()
    if init == 0:
        os.close(status_w)
        os.close(alive_w)
        os.close(report_r)
        _init(request, alive_r, report_w)
    os.close(alive_r)
    os.close(report_w)
    said = b""
    while chunk := os.read(report_r, 512):
        said += chunk
    os.waitpid(init, 0)
    text = said.decode(errors="replace")
    if text.startswith("E"):
        _fail(status_w, text[1:])
    # "S<wait status>"; nothing at all when init was killed (the evaluator reads that as killed)
    os.write(status_w, said)
    os._exit(0)


def _fail(status_w: int, why: str) -> None:
    os.write(2, f"tik-sandbox: {why}\n".encode())
    os.write(status_w, f"E{why}".encode())
    os._exit(SETUP_FAILED)


def _why(e: BaseException) -> str:
    if isinstance(e, OSError):
        return f"{e.strerror}" + (f": {e.filename}" if e.filename else "")
    return str(e)


def spawn(server: socket.socket, request: dict, out: int, err: int) -> tuple[int, int, int]:
    """Fork the holder of one child: (its pid here, the read end of its status pipe, a pidfd of it)."""
    name = request.get("dir")
    if not isinstance(name, str) or not NAME.match(name) or not os.path.isdir(f"{POOL}/{name}/scratch"):
        raise ValueError(f"not a child's directory in the pool: {str(name)[:80]!r}")
    status_r, status_w = os.pipe()
    me = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            server.close()  # the server's channel never reaches a child
            os.close(status_r)
            isolate.die_with_parent()
            if os.getppid() != me:
                os._exit(SETUP_FAILED)
            os.setsid()  # a process group of its own, as the launcher has: the evaluator may kill the group
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.close(out)
            os.close(err)
            _holder(name, request, status_w)
        finally:
            os._exit(SETUP_FAILED)
    os.close(status_w)
    return pid, status_r, os.pidfd_open(pid)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(server: socket.socket) -> None:
    """Answer requests until the evaluator closes its end."""
    while True:
        ready = select.select([server], [], [], 0.5)[0]
        _reap()
        if not ready:
            continue
        msg, fds, _, _ = socket.recv_fds(server, MAX_REQUEST, 2)
        if not msg:
            return
        try:
            if len(fds) != 2:
                raise ValueError("a request brings the child's stdout and stderr")
            pid, status_r, pidfd = spawn(server, json.loads(msg), *fds)
        except (ValueError, OSError) as e:
            server.send(json.dumps({"error": _why(e)[:300]}).encode())
        else:
            socket.send_fds(server, [json.dumps({"pid": pid}).encode()], [status_r, pidfd])
            os.close(status_r)
            os.close(pidfd)
        finally:
            for fd in fds:
                os.close(fd)


def warm() -> dict:
    """Run the library's rmsnorm root on its CPU probes once, here, so that no child pays what a process's first
    kernel launches cost in the interpreter (Triton's and torch's lazy set-up: a tuner candidate's rmsnorm probes took
    0.40 s in a cold process and 0.10 s after this, whatever the operator). Trusted code only, on one thread: a torch
    op that started OpenMP's thread pool here would leave every forked child hanging in its own first parallel
    region. The thread count and torch's random state are put back as they were, so a child starts as a fresh
    process would. What it did (probes run, errors, seconds) goes to the evaluator with the ready message."""
    import torch

    from tik_kernels.contract import run_probes
    from tik_kernels.contracts.rmsnorm import CONTRACT

    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    torch.set_num_threads(1)
    t = time.monotonic()
    try:
        results = run_probes(importlib.import_module(CONTRACT.impl), CONTRACT.plan("cpu", 0).probes, "cpu")
        said = {"probes": len(results), "errors": sum(r.error is not None for r in results.values())}
    except Exception as e:  # a head start only: the children then pay it themselves
        said = {"failed": _why(e)[:200]}
    finally:
        torch.set_num_threads(threads)
        torch.random.set_rng_state(rng)
    return {**said, "s": round(time.monotonic() - t, 3)}


def main(argv: list[str]) -> None:
    server = socket.socket(fileno=int(argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # what a child imports before its job (`child.main`, `child._prestarted`), in that order: kernels first, so
    # TRITON_INTERPRET is set before Triton is imported
    for name in ("tik_kernels", "tik_kernels.evaluator.protocol", "tik_kernels.evaluator.timing",
                 "tik_kernels.evaluator.child", "torch", "triton", "tik_kernels.contract"):
        importlib.import_module(name)
    threads = len(os.listdir("/proc/self/task"))
    warmed = warm()
    server.send(json.dumps({"ready": os.getpid(), "threads": [threads, len(os.listdir("/proc/self/task"))],
                            "warm": warmed}).encode())
    serve(server)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
