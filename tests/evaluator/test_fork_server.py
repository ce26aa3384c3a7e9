"""The fork server (evaluator/zygote.py, forkserver.py): a forked candidate child sees exactly what a launched one
sees (no other child, no pool, no capability, no descriptor of the server's), planted cheats fail the same way both
ways, a hanging child dies with everything it started at its timeout, a server that dies costs only the speed-up,
the server holds no secret, and it forks nothing but a child's directory of its own pool."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from evaluator_fixtures import FIX, tiny
from planted import WRITABLE, alive, alive_with, descendants, kill_all, planted

from tik_kernels.evaluator import evaluate, sandbox, servers, spares
from tik_kernels.evaluator.forkserver import ForkServerError

ROOT = FIX / "tiny_root.py"
MODE, WHY = sandbox.availability()
pytestmark = pytest.mark.skipif(MODE is None, reason=f"the kernel refuses the sandbox's namespaces here: {WHY}")

LOOK = '''
import hashlib, json, os
''' + WRITABLE + '''
def status():
    lines = open("/proc/self/status").read().splitlines()
    return {k: v.strip() for k, v in (ln.split(":", 1) for ln in lines) if k in ("CapEff", "CapPrm", "CapAmb",
            "NoNewPrivs", "Uid", "Gid")}

SEEN = {
    "who": lambda: {"uid": os.getuid(), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
                    "ppid": os.getppid(), "cwd": os.getcwd(), "shm": sorted(os.listdir("/dev/shm"))},
    "caps": status,
    "files": lambda: {"writable": [p for p in ("/", "/usr", "/etc", "/tik/runtime/tik_kernels", "/tik/impl", "/tmp",
                                               "/dev/shm", "/tik/pool", "/proc") if writable(p)],
                      "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
                      "net": sorted(ln.split(":")[0].strip() for ln in open("/proc/net/dev").read().splitlines()[2:])},
    "tree": lambda: {"root": sorted(os.listdir("/")), "tmp": sorted(os.listdir("/tmp")),
                     "pool": sorted(os.listdir("/tik/pool")) if os.path.exists("/tik/pool") else None},
    "env": lambda: {"names": hashlib.sha256(" ".join(sorted(k for k in os.environ if k != "TIK_FORK_SERVER")).encode(
                    )).hexdigest()[:16], "tmpdir": os.environ["TMPDIR"], "home": os.environ["HOME"],
                    "cache": os.environ["TRITON_CACHE_DIR"], "path": os.environ["PYTHONPATH"]},
}
raise RuntimeError("SEEN" + json.dumps(SEEN[WHAT]()))
'''


def look(tmp_path: Path, what: str) -> dict:
    path = tmp_path / f"look_{what}.py"
    path.write_text(f"WHAT = {what!r}\n" + LOOK)
    rep = evaluate(tiny(), path, root_path=ROOT, device="cpu", timeout=60)
    assert rep.failure and "SEEN" in rep.failure, rep.failure
    return json.loads(rep.failure.partition("SEEN")[2])


def test_a_forked_child_sees_what_a_launched_child_sees(tmp_path, monkeypatch):
    monkeypatch.setenv(spares.PRESTART_ENV, "0")
    monkeypatch.setenv("TIK_FORK_SERVER", "0")
    launched = {w: look(tmp_path, w) for w in ("who", "caps", "files", "tree", "env")}
    monkeypatch.delenv("TIK_FORK_SERVER")
    # spares on: a sibling forked by the same server waits while each candidate runs
    monkeypatch.setenv(spares.PRESTART_ENV, "1")
    servers.SERVERS.ensure(MODE, "cpu", "private")
    server = servers.SERVERS.ready(MODE, "cpu")
    before = server.forked
    forked = {w: look(tmp_path, w) for w in ("who", "caps", "files", "tree", "env")}
    assert server.forked >= before + 5 and servers.SERVERS.ready(MODE, "cpu") is server
    assert spares.SPARES.pids(), "no sibling was alive"
    # the same uid, pid namespace of its own (its init and itself), cwd, an empty /dev/shm of its own, no
    # capability, no_new_privs, the same writable places, descriptors, network (loopback only) and environment
    assert forked["who"] == launched["who"] and forked["who"]["pids"] == [1, 2] and forked["who"]["shm"] == []
    assert forked["caps"] == launched["caps"] and forked["caps"]["CapEff"] == "0000000000000000"
    assert forked["caps"]["NoNewPrivs"] == "1"
    assert forked["files"] == launched["files"] and forked["files"]["writable"] == ["/tmp", "/dev/shm"]
    assert forked["env"] == launched["env"]
    # the one difference: the mount point of the server's pool, empty and read-only (a tmpfs over it)
    assert forked["tree"]["pool"] == [] and launched["tree"]["pool"] is None
    assert forked["tree"]["tmp"] == launched["tree"]["tmp"]
    assert forked["tree"]["root"] == launched["tree"]["root"]


#: planted fixtures whose cheat or crash is caught in the child or after it
CHEATS = ["forges", "mutates", "segfault", "obfuscated_import", "exits", "nosy"]


def test_planted_cheats_fail_the_same_way_forked(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake")  # nosy looks for it
    monkeypatch.setenv(spares.PRESTART_ENV, "0")

    def failures() -> dict:
        reps = {name: evaluate(tiny(), FIX / f"{name}.py", root_path=ROOT, device="cpu", timeout=60)
                for name in CHEATS}
        # (how each child started, as the evaluation's phases record it: what bench_scaleout.py counts)
        started.append({r.phases.get("probes_candidate_forked") for r in reps.values()})
        return {name: (r.verified, r.failure, [(c.name, c.passed) for c in r.checks]) for name, r in reps.items()}

    started: list[set] = []
    monkeypatch.setenv("TIK_FORK_SERVER", "0")
    launched = failures()
    monkeypatch.delenv("TIK_FORK_SERVER")
    servers.SERVERS.ensure(MODE, "cpu", "private")
    server = servers.SERVERS.ready(MODE, "cpu")
    before = server.forked
    forked = failures()
    assert server.forked == before + len(CHEATS) and started == [{0.0}, {1.0}]
    assert forked == launched
    assert [n for n, (ok, _, _) in forked.items() if ok] == ["nosy"]  # the fixtures did what they are for
    assert forked["segfault"][1] == "crashed with signal SIGSEGV", forked["segfault"][1]


def test_a_hanging_child_and_its_daemon_die_at_the_timeout(started, tmp_path):
    marker = f"tik-planted-{uuid.uuid4().hex}"
    path = tmp_path / "hang.py"
    path.write_text(planted("hang", (FIX / "tiny_root.py").read_text(), MARKER=marker))
    t0 = time.monotonic()
    rep = evaluate(tiny(), path, root_path=ROOT, device="cpu", timeout=6)
    assert rep.failure == "timed out after 6 s (killed)", rep.failure
    assert time.monotonic() - t0 < 40
    end = time.monotonic() + 5
    while alive_with(marker) and time.monotonic() < end:
        time.sleep(0.1)
    assert alive_with(marker) == []
    # and the next candidate is served as before
    assert evaluate(tiny(), FIX / "good.py", root_path=ROOT, device="cpu", timeout=60).verified


def test_a_dead_server_costs_only_the_speed_up(monkeypatch):
    monkeypatch.setenv(spares.PRESTART_ENV, "0")
    servers.SERVERS.ensure(MODE, "cpu", "private")
    server = servers.SERVERS.ready(MODE, "cpu")
    dropped = servers.SERVERS.stats["dropped"]
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    rep = evaluate(tiny(), FIX / "good.py", root_path=ROOT, device="cpu", timeout=60)
    assert rep.verified, rep.failure
    assert servers.SERVERS.stats["dropped"] == dropped + 1 and servers.SERVERS.ready(MODE, "cpu") is None
    # the spares' thread starts the next one
    servers.SERVERS.ensure(MODE, "cpu", "private")
    fresh = servers.SERVERS.ready(MODE, "cpu")
    assert fresh is not None and fresh is not server
    assert evaluate(tiny(), FIX / "good.py", root_path=ROOT, device="cpu", timeout=60).verified
    assert fresh.forked >= 1


def test_the_server_holds_no_secret_and_its_children_find_none(tmp_path, monkeypatch):
    """A key in the evaluator's environment when the server starts: not in the server's environment, and the planted
    candidate that reads every environment in its reach finds none."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-planted-test")
    monkeypatch.setenv(spares.PRESTART_ENV, "0")
    servers.SERVERS.close()
    servers.SERVERS.ensure(MODE, "cpu", "private")
    server = servers.SERVERS.ready(MODE, "cpu")
    zygotes = [p for p in descendants(server.proc.pid)
               if b"tik_kernels.evaluator.zygote" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(zygotes) == 1
    assert b"ANTHROPIC_API_KEY" not in Path(f"/proc/{zygotes[0]}/environ").read_bytes()
    path = tmp_path / "environ.py"
    path.write_text(planted("environ", (FIX / "tiny_root.py").read_text()))
    rep = evaluate(tiny(), path, root_path=ROOT, device="cpu", timeout=60)
    assert "RuntimeError: no key in the " in rep.failure, rep.failure
    assert server.forked >= 1


def test_the_server_forks_only_a_directory_of_its_pool(tmp_path):
    servers.SERVERS.ensure(MODE, "cpu", "private")
    server = servers.SERVERS.ready(MODE, "cpu")
    with pytest.raises(ForkServerError, match="not in the fork server's pool"):
        server.spawn(tmp_path, {}, "/tmp/work")
    # a request written by hand (what a confused or hostile evaluator thread could send) is answered, not obeyed
    for name in ("..", "../../etc", "tik-eval-1.2-x/../../x", "/etc", "tik-eval-1.2-nothere"):
        with open(os.devnull, "wb") as out, server.lock:
            socket.send_fds(server.sock, [json.dumps({"dir": name, "env": {}, "cwd": "/"}).encode()],
                            [out.fileno(), out.fileno()])
            reply = json.loads(server.sock.recv(4096))
        assert "not a child's directory in the pool" in reply["error"], (name, reply)
    assert server.alive() and servers.SERVERS.ready(MODE, "cpu") is server


def test_a_warmed_server_starts_no_thread_and_its_children_compute_the_same_bits(monkeypatch):
    """The server ran the rmsnorm root on its probes before serving (`zygote.warm`), without starting a thread (a
    thread pool it had started would be missing in every child); a child forked after that computes the library
    roots' probe outputs bit for bit as a launched child does."""
    import importlib

    import torch

    from tik_kernels.contract import same_bits
    from tik_kernels.evaluator import core

    monkeypatch.setenv(spares.PRESTART_ENV, "0")
    servers.SERVERS.ensure(MODE, "cpu", "private")
    server = servers.SERVERS.ready(MODE, "cpu")
    assert server.warmed["errors"] == 0 and server.warmed["probes"] > 0, server.warmed
    assert server.threads[0] == server.threads[1], server.threads
    for op in ("rmsnorm", "silu_mul"):
        contract = importlib.import_module(f"tik_kernels.contracts.{op}").CONTRACT
        plan = contract.plan("cpu", 0)
        monkeypatch.setenv("TIK_FORK_SERVER", "0")
        launched, failure = core.run_probes(plan, contract.root_path, "cpu", 60)
        assert failure is None
        monkeypatch.delenv("TIK_FORK_SERVER")
        before = server.forked
        forked, failure = core.run_probes(plan, contract.root_path, "cpu", 60)
        assert failure is None and server.forked == before + 1
        assert launched.keys() == forked.keys()
        for pid, a in launched.items():
            b = forked[pid]
            assert a.error is None and b.error is None, (pid, a.error, b.error)
            assert len(a.outputs) == len(b.outputs) > 0
            assert all(x.dtype == y.dtype and same_bits(x, y) for x, y in zip(a.outputs, b.outputs, strict=True)), pid
        assert any(t.dtype == torch.bfloat16 for r in forked.values() for t in r.outputs)


UNMOUNT = '''
import ctypes, json, os

def attack():
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    # a user and mount namespace of its own, where it holds every capability: then it takes away what hides things
    if libc.unshare(0x10000000 | 0x00020000) != 0:
        return {"unshare": os.strerror(ctypes.get_errno())}
    for name, data in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(data)
    said = {}
    for point in ("/tik/pool", "/proc", "/tmp", "/dev/shm", "/tik/impl"):
        said[point] = "unmounted" if libc.umount2(point.encode(), 2) == 0 else os.strerror(ctypes.get_errno())
    said["pool"] = sorted(os.listdir("/tik/pool")) if os.path.isdir("/tik/pool") else None
    said["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    return said

# in a fork: unshare(CLONE_NEWUSER) needs a single-threaded process, which an interpreter with torch imported is not
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        os.write(w, json.dumps(attack()).encode())
    except Exception as e:
        os.write(w, json.dumps({"error": repr(e)}).encode())
    os._exit(0)
os.close(w)
data = b""
while chunk := os.read(r, 4096):
    data += chunk
os.waitpid(pid, 0)
raise RuntimeError("TRIED" + data.decode())
'''


def test_a_child_with_capabilities_of_its_own_cannot_unmount_what_hides_the_rest(started, tmp_path):
    """The candidate enters a user namespace of its own (allowed: it has every capability there) and a mount namespace
    with it, then unmounts what covers the pool, /proc, its scratch, /dev/shm and its implementation files: the
    mounts it inherited are locked together, so every unmount is refused and it still sees no pool and no other
    process."""
    path = tmp_path / "unmount.py"
    path.write_text(UNMOUNT + (FIX / "tiny_root.py").read_text())
    rep = evaluate(tiny(), path, root_path=ROOT, device="cpu", timeout=60)
    assert rep.failure and "TRIED{" in rep.failure, rep.failure
    said = json.loads(rep.failure.partition("TRIED")[2])
    points = ("/proc", "/tmp", "/dev/shm", "/tik/impl") + (("/tik/pool",) if started is not None else ())
    assert all(said[p] == "Invalid argument" for p in points), said
    # init, the child and its own fork (a pid a thread of the child took is skipped), nothing else
    assert said["pool"] == ([] if started is not None else None), said
    assert said["pids"][:2] == [1, 2] and len(said["pids"]) == 3, said


def test_sigkill_of_the_evaluator_takes_the_server_and_a_forked_child_with_its_daemon(tmp_path):
    """The evaluator (a fresh process, as `tik check` or a worker) evaluates a good candidate, which starts its fork
    server, then one whose forked child starts a daemon and hangs. SIGKILL the evaluator: 5 s later the server, the
    child and the daemon are gone, and `reap_stale` removes the server's directory (its pool) with the rest."""
    marker = f"tik-planted-{uuid.uuid4().hex}"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    hang = tmp_path / "hang.py"
    hang.write_text(planted("hang", (FIX / "tiny_root.py").read_text(), MARKER=marker))
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("sandbox_driver.py")), str(FIX / "good.py"),
                             str(hang)], env={**os.environ, "PYTHONPATH": str(repo), "TMPDIR": str(tmp),
                                              spares.PRESTART_ENV: "1"}, stdout=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 120
        while not alive_with(marker) and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.2)
        assert alive_with(marker), "the candidate's daemon never started"
        # the server and what it forked (holders, inits, children: a fork keeps the server's command line)
        servers = [p for p in descendants(proc.pid)
                   if b"tik_kernels.evaluator.zygote" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(servers) >= 4
        # the hanging child was forked: its directory is in the server's pool
        assert list(tmp.glob(f"tik-forks-{proc.pid}.*/pool/tik-*-{proc.pid}.*"))
        proc.kill()
        proc.wait(10)
        end = time.monotonic() + 5
        while (alive_with(marker) or any(alive(p) for p in servers)) and time.monotonic() < end:
            time.sleep(0.1)
        assert alive_with(marker) == [] and not any(alive(p) for p in servers)
    finally:
        proc.kill()
        kill_all(marker)
    owned = [d for d in tmp.iterdir() if sandbox.OWNED.match(d.name) and f"-{proc.pid}." in d.name]
    assert any(d.name.startswith("tik-forks-") for d in owned)
    sandbox.reap_stale(tmp)
    assert not [d for d in owned if d.exists()]


def test_prepare_starts_the_server_in_the_background_where_children_are_forked(monkeypatch):
    """`spares.prepare` (an evaluator process starting: a slot, the inline executor) starts the fork server
    without waiting for it, and only where a child would be forked."""
    own_servers, own_spares = servers._Servers(), spares.Spares()
    monkeypatch.setattr(servers, "SERVERS", own_servers)  # read there by the spares' thread too
    monkeypatch.setattr(spares, "SPARES", own_spares)
    try:
        for off in ({"device": "cuda"}, {"env": ("TIK_FORK_SERVER", "0")}, {"env": (spares.PRESTART_ENV, "0")}):
            with monkeypatch.context() as m:
                if "env" in off:
                    m.setenv(*off["env"])
                spares.prepare(off.get("device", "cpu"))
            assert own_spares.thread is None and own_servers.stats["started"] == 0, off
        t0 = time.monotonic()
        spares.prepare("cpu")
        assert time.monotonic() - t0 < 0.5  # in the background
        deadline = time.monotonic() + 120
        while own_servers.ready(MODE, "cpu") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert own_servers.ready(MODE, "cpu") is not None and own_servers.stats["started"] == 1
        spares.prepare("cpu")  # already up: nothing more
        own_spares.queue.put(None)  # (after the request above, which the thread then finds already served)
        own_spares.thread.join(timeout=60)
        assert own_servers.stats["started"] == 1
    finally:
        own_spares.close()
        own_servers.close()
