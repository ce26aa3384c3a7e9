"""This process's fork servers (`_Servers`, `SERVERS`). On the CPU, once the server is up, a jailed
candidate child with a private Triton cache is a fork of that server instead of a fresh interpreter: a trusted process
in the same jail (`zygote.py`, spoken to through `forkserver.py`) that has imported what a child imports; each fork
enters namespaces of its own with the same view (its scratch, its implementation files, a fresh /dev/shm and /proc)
and runs the child without exec, so it starts in milliseconds instead of ~1.2 s of CPU.

`_start` is where every child's start is decided: forked by the server when its directory is in the pool of a server
that still serves its world (`_child_tempdir`, `_world_key`), else launched (`sandbox._popen`) like any other. A
server is started in the world a child started now would get and forks children only into that world; one that died,
stopped answering or no longer matches is stopped, and the children it would have forked are launched, so a server
costs nothing but the speed-up when it fails. This sits on the jail (`sandbox.py`: the child's world, the launcher);
the spares' thread (`spares.py`) is what starts the servers.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

from tik_kernels.evaluator import forkserver
from tik_kernels.evaluator.forkserver import Forked, ForkServer, ForkServerError
from tik_kernels.evaluator.sandbox import NOBODY, _dumps, _give, _popen, _world, owned_tempdir

#: where a fork server's pool is in its jail (zygote.POOL)
JAIL_POOL = "/tik/pool"
#: environment variables a fork server's world key leaves out (`_world_key`)
VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})


def forks(mode: str | None, device: str, cache: str) -> bool:
    """Whether such a child is one a fork server forks (jailed, CPU, a private Triton cache; `forkserver.wanted`)."""
    return mode is not None and cache == "private" and forkserver.wanted(device)


def _world_key(mode: str | None, device: str) -> str:
    """The world a private-cache child started now would get (`sandbox._world`), its directories left out: a fork server
    forks a child only into the world it was started in (the same environment, mounts, hidden paths, devices)."""
    here = Path("/tik-world-key")
    env, spec, _ = _world(here, mode, device, "private", here / "scratch" / "triton-cache")
    # a forked child gets the environment of its request, exactly; the key is for what the server's imports may
    # have read, which never includes the name of the running test (pytest changes it at every phase of a test)
    spec["env"] = env = {k: v for k, v in env.items() if k not in VOLATILE}
    return _dumps({"mode": mode, "device": device, "env": env, "spec": spec})


def _child_tempdir(prefix: str, mode: str | None, device: str, cache: str) -> Path:
    """A child's directory: in the pool of a fork server ready for it, else in the system's temporary directory."""
    server = SERVERS.ready(mode, device) if cache == "private" else None
    if server is None:
        return owned_tempdir(prefix)
    tmp = owned_tempdir(prefix, server.pool)
    if mode == "nobody":
        os.chown(tmp, NOBODY, NOBODY)  # the server's user goes through it to the child's scratch and implementation
    return tmp


def _start(tmp: Path, mode: str | None, device: str, cache: str,
           cache_dir: Path) -> tuple[subprocess.Popen | Forked, dict]:
    """Start the child staged in `tmp` (its job.json written) in its world (`sandbox._world`): the process and its
    launcher spec. Run as "nobody", the child is given its scratch and a cache mounted from outside. A child whose
    directory is in a fork server's pool (`_child_tempdir`) is forked by that server when it still serves this world,
    else started by the launcher like any other."""
    env, spec, shared = _world(tmp, mode, device, cache, cache_dir)
    if mode == "nobody":
        _give(tmp / "scratch")
        if shared is not None:
            _give(shared)
    server = SERVERS.serving(tmp, mode, device) if shared is None else None
    if server is not None:
        try:
            return server.spawn(tmp, env, spec["cwd"]), spec
        except ForkServerError:
            SERVERS.drop(server)
    return _popen(tmp, env, spec), spec


def _start_server(mode: str, device: str, key: str) -> ForkServer:
    """Start a fork server (`zygote.py`) in the jail a private-cache child of `device` gets, with its pool mounted
    read-write at JAIL_POOL, and wait until it has imported what a child imports."""
    tmp = owned_tempdir("tik-forks-")
    theirs = None
    try:
        pool = tmp / "pool"
        (tmp / "scratch" / "work").mkdir(parents=True)
        (tmp / "impl").mkdir()
        pool.mkdir()
        if mode == "nobody":
            _give(tmp / "scratch")
            _give(pool)
        env, spec, _ = _world(tmp, mode, device, "private", tmp / "scratch" / "triton-cache")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        spec["argv"] = [sys.executable, "-m", "tik_kernels.evaluator.zygote", str(theirs.fileno())]
        spec["rw"].append([str(pool), JAIL_POOL])
        server = ForkServer(_popen(tmp, env, spec, pass_fds=(theirs.fileno(),)), ours, tmp, pool, key)
        theirs.close()
        try:
            server.await_ready()
        except BaseException:
            server.close()
            raise
        return server
    except BaseException:
        if theirs is not None:
            theirs.close()
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class _Servers:
    """This process's fork servers, one per (uid mode, device): started by `ensure` (only from the spares' thread,
    which lives as long as the process: a launcher dies with the thread that started it), used through `ready` and
    `serving`; a server that died, stopped answering or no longer matches the world (`_world_key`) is stopped and
    the children it would have forked are started by the launcher. The servers die with this process (atexit, and
    the launcher's PDEATHSIG chain); their directories are owned (`sandbox.reap_stale`)."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.lock = threading.Lock()
        self.servers: dict[tuple, ForkServer] = {}
        #: stopped servers, whose pools may still hold a live child's directory: removed at exit
        self.retired: list[ForkServer] = []
        self.stats = {"started": 0, "failed": 0, "dropped": 0}
        self.registered = False

    def _mine(self) -> None:
        """A forked copy of this process has no server (the socket is its parent's)."""
        if self.owner != os.getpid():
            self.__init__()

    def ensure(self, mode: str | None, device: str, cache: str) -> None:
        """Start the server for such a child if it would serve one and none is running (blocks for its start)."""
        if not forks(mode, device, cache):
            return
        self._mine()
        if self.ready(mode, device) is not None:
            return
        key = _world_key(mode, device)
        try:
            server = _start_server(mode, device, key)
        except (ForkServerError, OSError):  # it only costs the speed-up: children start the usual way
            self.stats["failed"] += 1
            return
        with self.lock:
            old = self.servers.pop((mode, device), None)
            self.servers[(mode, device)] = server
            self.stats["started"] += 1
            if not self.registered:
                import atexit

                atexit.register(self.close)
                self.registered = True
        if old is not None:
            self.drop(old)

    def ready(self, mode: str | None, device: str) -> ForkServer | None:
        """The live server for (mode, device) whose world is this process's now, else None."""
        if not forks(mode, device, "private"):
            return None
        self._mine()
        with self.lock:
            server = self.servers.get((mode, device))
        if server is None:
            return None
        if not server.alive() or server.key != _world_key(mode, device):
            self.drop(server)
            return None
        return server

    def serving(self, tmp: Path, mode: str | None, device: str) -> ForkServer | None:
        """The server that may fork the child staged in `tmp`: ready, and `tmp` is in its pool."""
        server = self.ready(mode, device)
        return server if server is not None and tmp.parent == server.pool else None

    def drop(self, server: ForkServer) -> None:
        with self.lock:
            for k, v in list(self.servers.items()):
                if v is server:
                    del self.servers[k]
            if server in self.retired:
                return
            self.retired.append(server)
            self.stats["dropped"] += 1
        server.close(remove=False)

    def close(self) -> None:
        """Stop every server and remove their directories (atexit)."""
        if self.owner != os.getpid():
            return
        with self.lock:
            servers = list(self.servers.values()) + self.retired
            self.servers.clear()
            self.retired = []
        for server in servers:
            server.close()


#: this process's fork servers
SERVERS = _Servers()
