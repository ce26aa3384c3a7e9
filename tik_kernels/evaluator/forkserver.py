"""The evaluator's side of the fork server (`zygote.py`): a jailed process that has imported what a candidate child
imports, and forks one child per request into namespaces of its own, so a child starts in ~10 ms of work instead of
~1.2 s of CPU (benchmarks/results/fork_probe_cpu.txt; issue #18).

`servers` decides which children it serves and starts it (the launcher and jail are `sandbox`'s); this module holds
the protocol: `ForkServer.spawn` sends one request (the child's directory in the pool, its environment and cwd, its
stdout and stderr as descriptors) and gets back the child's status pipe and a pidfd of its holder, wrapped in `Forked`,
which the sandbox handles as it handles the launcher's `Popen` (poll, wait with a timeout, kill).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

#: "0": never fork children (each is started by the launcher). Only CPU children are forked: a GPU child's Triton
#: cache is shared with its evaluation or the process (mounted from outside its scratch), and a GPU child's start is
#: already off the critical path (a pre-started child, `spares.Spares`)
ENV = "TIK_FORK_SERVER"
#: the launcher's exit status when it could not build the jail (isolate.SETUP_FAILED)
SETUP_FAILED = 125
#: how long a starting server may take to import (a fresh child's start, on a loaded machine)
START_S = 120.0


class ForkServerError(Exception):
    pass


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the process group a launcher's Popen leads (it was started in a session of its own), then reap it,
    waiting 10 s at most."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def wanted(device: str) -> bool:
    return device == "cpu" and os.environ.get(ENV, "").strip() != "0"


def _host_pid(pidfd: int) -> int:
    """The pid, in this process's pid namespace, of the process a pidfd refers to."""
    with open(f"/proc/self/fdinfo/{pidfd}") as f:
        for line in f:
            if line.startswith("Pid:"):
                return int(line.split()[1])
    raise ForkServerError("the kernel does not say which process the pidfd is")


class Forked:
    """A child forked by the server, handled like the launcher's Popen: `pid` (its holder here: the leader of its
    process group), `poll`, `wait(timeout)` (raising subprocess.TimeoutExpired), `kill`. Its exit status arrives on
    the status pipe: the child's own (a negative signal number when a signal ended it), SETUP_FAILED when the jail
    could not be built, -SIGKILL when the holder died without a word (killed)."""

    def __init__(self, status_fd: int, pidfd: int):
        self.status_fd, self.pidfd = status_fd, pidfd
        self.pid = _host_pid(pidfd)
        self.returncode: int | None = None
        self._said = b""
        os.set_blocking(status_fd, False)

    def _read(self) -> None:
        while self.returncode is None:
            try:
                chunk = os.read(self.status_fd, 512)
            except BlockingIOError:
                return
            if chunk:
                self._said += chunk
                continue
            text = self._said.decode(errors="replace")
            if text.startswith("S") and text[1:].isdigit():
                self.returncode = os.waitstatus_to_exitcode(int(text[1:]))
            elif text.startswith("E"):
                self.returncode = SETUP_FAILED
            else:
                self.returncode = -signal.SIGKILL
            os.close(self.status_fd)
            os.close(self.pidfd)

    def poll(self) -> int | None:
        self._read()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._read()
            if self.returncode is not None:
                return self.returncode
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout)
            select.select([self.status_fd], [], [], left)

    def kill(self) -> None:
        """SIGKILL to the holder, through its pidfd: never another process that reused its pid (a process group id
        could be reused once the server has reaped the holder). The holder's death takes init with it
        (PR_SET_PDEATHSIG), and init's the child's whole pid namespace, whatever sessions the child made there."""
        if self.poll() is not None:
            return
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except OSError:  # gone already
            pass


class ForkServer:
    """One server: its launcher (a `Popen`, in its jail), our end of the socket pair, its pool directory (mounted at
    /tik/pool in its jail) and the key of the world it was started in (a child is forked only into the same world)."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket, tmp: Path, pool: Path, key: str):
        self.proc, self.sock, self.tmp, self.pool, self.key = proc, sock, tmp, pool, key
        self.lock = threading.Lock()
        self.forked = 0
        self.threads: list[int] | None = None
        self.warmed: dict | None = None

    def await_ready(self, limit_s: float = START_S) -> None:
        """Wait for the server's first word (its imports done), or raise ForkServerError."""
        if not select.select([self.sock], [], [], limit_s)[0]:
            raise ForkServerError(f"the fork server did not start within {limit_s:g} s")
        msg = self.sock.recv(4096)
        said = json.loads(msg) if msg else {}
        if "ready" not in said:
            raise ForkServerError(f"the fork server did not start (exit status {self.proc.poll()})")
        #: the server's OS threads after its imports and after its warm-up (`zygote.warm`): the same, or a thread the
        #: warm-up started is missing in every forked child
        self.threads = said.get("threads")
        #: what the warm-up did (`zygote.warm`): probes run, errors, seconds
        self.warmed = said.get("warm")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, tmp: Path, env: dict, cwd: str) -> Forked:
        """Fork the child staged in `tmp` (a directory of the pool: job.json in its scratch) with `env` and `cwd`."""
        if tmp.parent != self.pool:
            raise ForkServerError(f"{tmp} is not in the fork server's pool")
        request = json.dumps({"dir": tmp.name, "env": env, "cwd": cwd}).encode()
        with open(tmp / "stdout.txt", "wb") as out, open(tmp / "stderr.txt", "wb") as err, self.lock:
            try:
                socket.send_fds(self.sock, [request], [out.fileno(), err.fileno()])
                if not select.select([self.sock], [], [], 30)[0]:
                    raise ForkServerError("the fork server did not answer")
                msg, fds, _, _ = socket.recv_fds(self.sock, 4096, 2)
            except OSError as e:
                raise ForkServerError(f"the fork server is gone ({e.strerror})") from None
        if not msg:
            raise ForkServerError("the fork server is gone")
        reply = json.loads(msg)
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            raise ForkServerError(f"the fork server refused: {reply.get('error', reply)}")
        self.forked += 1
        return Forked(*fds)

    def close(self, remove: bool = True) -> None:
        """Stop the server (its children die with it); `remove`: its directories too (not while another process may
        still use a directory of its pool: a child started by the launcher there after the server stopped)."""
        import shutil

        try:
            self.sock.close()
        except OSError:
            pass
        kill_group(self.proc)
        if remove:
            shutil.rmtree(self.tmp, ignore_errors=True)
