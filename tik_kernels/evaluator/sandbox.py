"""Spawning the child: a fresh interpreter (fork+exec of the launcher, never a fork of this process) in a jail
(`isolate.py`: new user, pid, mount, network, IPC and UTS namespaces), a scrubbed environment, a hard timeout
that kills the whole process group, and the result read back through `protocol`. On the CPU, once this process's fork
server is up (`_Servers`; `forkserver.py`, `zygote.py`), a child is a fork of that server instead: a trusted process
in the same jail that has imported what a child imports; each fork enters namespaces of its own with the same view
(its scratch, its implementation files, a fresh /dev/shm and /proc) and runs the child without exec.

What the child sees (`_spec`): the system directories and Python read-only, the trusted runtime it imports
(this checkout's `tik_kernels/`, read-only at /tik/runtime), the implementation files of its job (copies,
read-only at /tik/impl), its own scratch directory read-write at /tmp, the GPU device nodes and a fresh /proc
of its own pid namespace. Not the workspace, not the rest of the checkout, not the parent's processes, no
network. Where the kernel refuses the namespaces, untrusted children do not run (`isolation`), unless the
caller opted out: `evaluate(..., sandbox=False)`, or `TIK_UNSAFE_NO_SANDBOX=1`, which `--unsafe-no-sandbox`
sets.

A timed evaluation's candidate child is usually pre-started (`Spares`): the same child in the same jail, started
while the previous candidate was evaluated, waiting for its first job; it serves one candidate.

Every scratch directory is named after its owner (`owned_tempdir`: evaluator pid and start time), so a later
process can tell a dead evaluator's leftovers from a live one's and remove them (`reap_stale`).
"""

from __future__ import annotations

import contextlib
import contextvars
import glob
import json
import os
import queue
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tik_kernels
from tik_kernels.evaluator import forkserver
from tik_kernels.evaluator.forkserver import Forked, ForkServer, ForkServerError, kill_group
from tik_kernels.evaluator.protocol import ProtocolError, read_json

#: variables the child never sees, whatever their value
SECRET = re.compile(r"(^ANTHROPIC_|KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|^AWS_|^GH_|^GITHUB_)", re.I)
#: the package root, so `python -m tik_kernels.evaluator.child` imports this checkout from any cwd
PACKAGE_ROOT = Path(tik_kernels.__file__).resolve().parent.parent
RUNTIME = PACKAGE_ROOT / "tik_kernels"
ISOLATE = Path(__file__).resolve().with_name("isolate.py")
#: where things are inside the jail
JAIL_SCRATCH, JAIL_RUNTIME, JAIL_IMPL, JAIL_CACHE = "/tmp", "/tik/runtime", "/tik/impl", "/tik/triton-cache"
#: the launcher's exit status when it could not build the jail (its stderr then says why, `tik-sandbox: ...`)
SETUP_FAILED = 125
NOBODY = 65534
UNSAFE_ENV = "TIK_UNSAFE_NO_SANDBOX"
#: a per-call override of UNSAFE_ENV (`evaluate(sandbox=...)`): True = no sandbox
_UNSAFE: contextvars.ContextVar[bool | None] = contextvars.ContextVar("tik_unsafe_no_sandbox", default=None)
#: top-level system directories the child sees read-only (symlinks among them are recreated as symlinks)
SYSTEM = ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "sys")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
#: owned scratch directories: tik-<kind>-<owner pid>.<owner start time>-<random>
OWNED = re.compile(r"^tik-[a-z-]+?-(\d+)\.(\d+)-[^/]*$")


# ----------------------------------------------------------------------------- policy


def unsafe() -> bool:
    """True when children run without the sandbox, by the caller's explicit choice."""
    v = _UNSAFE.get()
    return v if v is not None else os.environ.get(UNSAFE_ENV, "") not in ("", "0")


@contextlib.contextmanager
def policy(sandbox: bool | None) -> Iterator[None]:
    """Within this block (this thread), `sandbox=False` runs children without the sandbox; None: the default."""
    token = _UNSAFE.set(None if sandbox is None else not sandbox)
    try:
        yield
    finally:
        _UNSAFE.reset(token)


#: (uid mode, None) once the jail has started here, or (None, why not); see `availability`
_AVAILABLE: tuple[str | None, str | None] | None = None


def availability() -> tuple[str | None, str | None]:
    """Whether the jail starts on this machine, tried once per process: ("nobody" | "self", None) or
    (None, the launcher's one-line reason). "nobody": root, the child runs as uid 65534; "self": the child
    runs as this user's uid (root's 0 when mapping nobody is refused, still without capabilities)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        reason = "unknown"
        for mode in (("nobody", "self") if os.geteuid() == 0 else ("self",)):
            reason = _try_jail(mode)
            if reason is None:
                _AVAILABLE = (mode, None)
                break
        else:
            _AVAILABLE = (None, reason)
    return _AVAILABLE


def _try_jail(mode: str) -> str | None:
    tmp = owned_tempdir("tik-probe-")
    try:
        (tmp / "scratch").mkdir()
        (tmp / "impl").mkdir()
        if mode == "nobody":
            try:
                _give(tmp / "scratch")
            except OSError as e:  # no uid 65534 here (tik itself runs in a user namespace)
                return f"chown to uid {NOBODY}: {e.strerror}"
        argv = [sys.executable, "-I", "-S", "-c", "open('/tmp/ok', 'w').close()"]
        spec = _spec(tmp, mode, argv, {"PATH": "/usr/bin:/bin"}, "/tmp", "cpu", None)
        (tmp / "root").mkdir()
        (tmp / "spec.json").write_text(json.dumps(spec))
        try:
            out = subprocess.run([sys.executable, "-I", "-S", str(ISOLATE), str(tmp / "spec.json")],
                                 capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"the launcher did not run ({type(e).__name__})"
        if out.returncode == 0 and (tmp / "scratch" / "ok").exists():
            return None
        lines = [ln for ln in out.stderr.splitlines() if ln.startswith("tik-sandbox: ")]
        return lines[-1].removeprefix("tik-sandbox: ") if lines else f"exit status {out.returncode}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def isolation(trusted: bool) -> tuple[str | None, str | None]:
    """(uid mode, refusal) for one child: the jail's uid mode, or None to run it without namespaces (the caller
    opted out, or a trusted child where the jail does not start); a refusal line when it must not run."""
    if unsafe():
        return None, None
    mode, reason = availability()
    if mode is not None or trusted:
        return mode, None
    return None, refusal(reason)


def refusal(reason: str | None) -> str:
    return (f"the candidate sandbox cannot start here ({reason}); candidates do not run without it "
            f"(--unsafe-no-sandbox runs them unconfined)")


def required() -> str | None:
    """The one-line refusal when untrusted code may not run here, else None (for the command line)."""
    return isolation(trusted=False)[1]


# ----------------------------------------------------------------------------- scratch directories


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])


def owned_tempdir(prefix: str, parent: Path | None = None) -> Path:
    """A new temporary directory whose name says which process owns it (`reap_stale` removes it once that
    process is dead). `prefix` is `tik-<kind>-`; `parent`: where (the system's temporary directory by default)."""
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.{_start_time(os.getpid())}-", dir=parent))


def _owner_alive(name: str) -> bool:
    m = OWNED.match(name)
    return m is None or _start_time(int(m[1])) == int(m[2])


def reap_stale(tmpdir: str | Path | None = None) -> tuple[int, int]:
    """Kill the processes and remove the scratch directories that dead evaluators left (a SIGKILL gives them
    no chance to clean up): (processes killed, directories removed)."""
    tmpdir = Path(tmpdir or tempfile.gettempdir())
    dead = {d.name for d in _listdir(tmpdir) if OWNED.match(d.name) and not _owner_alive(d.name)}
    killed = 0
    if dead:
        names = re.compile("|".join(re.escape(str(tmpdir / n)) for n in dead))
        for proc in _listdir(Path("/proc")):
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if names.search(cmdline):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(proc.name), signal.SIGKILL)
                    killed += 1
    for name in dead:
        shutil.rmtree(tmpdir / name, ignore_errors=True)
    return killed, len(dead)


def _listdir(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


def _give(path: Path) -> None:
    """Hand a directory tree to the jail's user (nobody) when the evaluator is root."""
    os.chown(path, NOBODY, NOBODY)
    for d, dirs, files in os.walk(path):
        for n in dirs + files:
            os.chown(os.path.join(d, n), NOBODY, NOBODY, follow_symlinks=False)


# ----------------------------------------------------------------------------- Triton caches


#: compiled kernels of trusted children (the root's probes) in this evaluator process, see `triton_cache`
_TRUSTED_CACHE: Path | None = None


def trusted_cache_dir() -> Path:
    global _TRUSTED_CACHE
    if _TRUSTED_CACHE is None:
        import atexit

        _TRUSTED_CACHE = owned_tempdir("tik-trusted-triton-")
        atexit.register(shutil.rmtree, _TRUSTED_CACHE, True)
    return _TRUSTED_CACHE


#: the Triton cache of the evaluation in progress (this thread), see `candidate_cache`
_CANDIDATE_CACHE: contextvars.ContextVar[list | None] = contextvars.ContextVar("tik_candidate_cache", default=None)


@contextlib.contextmanager
def candidate_cache() -> Iterator[None]:
    """Within this block, children started with cache="candidate" share one Triton cache: a seeded copy made
    when the first of them starts, removed when the block ends. The candidate's child (probes, then timing:
    `PhasedChild`) is such a child, and where probes and timing run in separate children (a timing child of
    its own, the evidence jobs) they share it, so the kernels the probes compiled are loaded, not compiled
    again, when the candidate is timed (on the H200 the timing child's warm-up was 11 s for rmsnorm and 25 s
    for attention, mostly those compiles: benchmarks/results/eval_rate_h200_before.md).

    This trusts the candidate no more than before. What the probe child writes there is read only by the
    timing child, which runs that same candidate in its own process beside the root and incumbent: code that
    could plant a slow kernel for the root in the cache can already patch the root's module in that process.
    Neither is trusted: the root's and incumbent's times are checked against the control child, which runs
    without the candidate on a fresh copy of the trusted cache, and every output against the parent's."""
    holder: list = []
    token = _CANDIDATE_CACHE.set(holder)
    try:
        yield
    finally:
        _CANDIDATE_CACHE.reset(token)
        for d in holder:
            shutil.rmtree(d, ignore_errors=True)


def triton_cache(mode: str, tmp: Path) -> Path:
    """The Triton cache directory of a child. "private": empty, its own. "trusted": the process's shared
    directory, which only children running trusted code (the root) get, so they alone write it. "seeded": a
    private copy of the shared directory: a candidate that keeps most of the root's kernels (a tuner changing
    one tile bucket) loads them instead of compiling them again (Triton's key is the kernel's source and
    constants, not the file), and what it writes or deletes stays in its copy. "candidate": within
    `candidate_cache()`, one seeded copy shared by the evaluation's candidate children; "seeded" elsewhere."""
    if mode not in ("private", "trusted", "seeded", "candidate"):
        raise ValueError(f"unknown cache mode {mode!r}")
    if mode == "trusted":
        return trusted_cache_dir()
    holder = _CANDIDATE_CACHE.get() if mode == "candidate" else None
    if holder:
        return holder[0] / "triton-cache"
    base = owned_tempdir("tik-cand-triton-") if holder is not None else tmp
    own = _seeded(base / "triton-cache") if mode in ("seeded", "candidate") else base / "triton-cache"
    own.mkdir(parents=True, exist_ok=True)
    if holder is not None:
        holder.append(base)
    return own


def _seeded(own: Path) -> Path:
    """`own`, created as a copy of the trusted cache (empty when there is none yet)."""
    if _TRUSTED_CACHE is not None and _TRUSTED_CACHE.is_dir():
        shutil.copytree(_TRUSTED_CACHE, own, dirs_exist_ok=True, ignore=shutil.ignore_patterns("tmp.*"))
    own.mkdir(parents=True, exist_ok=True)
    return own


# ----------------------------------------------------------------------------- the child's world


def child_env(device: str, tmp: Path | str, cache_dir: Path | str | None = None,
              runtime: Path | str | None = None) -> dict[str, str]:
    """The child's environment: the parent's without secrets; `tmp`, `cache_dir` and `runtime` as the child
    sees them (in the jail: /tmp, ..., /tik/runtime; without it the host paths and the parent's PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if not SECRET.search(k)}
    if runtime is None:
        env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    else:
        env["PYTHONPATH"] = str(runtime)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["TMPDIR"] = str(tmp)
    # a private Triton cache (or a private copy of the trusted one): a candidate cannot plant compiled kernels
    # another evaluation would load
    env["TRITON_CACHE_DIR"] = str(cache_dir or Path(tmp) / "triton-cache")
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
        # one OpenMP / BLAS thread (unless the user chose): the interpreter's numpy work comes in blocks too small to
        # share, while each idle pool thread spins on a core that the evaluator, the next candidate or another slot
        # needs (2-core machine, linear, 24 evaluations with 2 slots: 4,456 -> 5,385 an hour with every process on
        # one thread; benchmarks/results/scaleout_cpu_s23_omp1_linear.md)
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _compiler_dirs() -> list[str]:
    """The installation of the C compiler Triton builds its launcher stubs with ($CC, else cc / gcc / clang on
    PATH): a compiler outside the system directories (the H200 image's /opt/gcc/bin/gcc) must be visible in the
    jail, or every GPU child fails on its first kernel launch. <prefix>/bin/gcc gives <prefix> (its libexec and
    binutils live there too)."""
    out = []
    for c in (os.environ.get("CC"), shutil.which("cc"), shutil.which("gcc"), shutil.which("clang")):
        if not c or not os.path.isfile(c):
            continue
        for path in {c, os.path.realpath(c)}:
            bin_dir = os.path.dirname(os.path.abspath(path))
            prefix = os.path.dirname(bin_dir) if os.path.basename(bin_dir) == "bin" else bin_dir
            out.append(bin_dir if prefix in ("/", "/usr", "/usr/local") else prefix)
    return out


def _system() -> tuple[list[list[str]], list[list[str]]]:
    """(read-only binds, symlinks) of the system: SYSTEM, then Python's own directories and library paths
    outside them (a pyenv or conda prefix, a virtualenv, LD_LIBRARY_PATH)."""
    binds, links = [], []
    for name in SYSTEM:
        p = "/" + name
        if os.path.islink(p):
            links.append([os.readlink(p), p])
        elif os.path.isdir(p):
            binds.append([p, p])
    extra = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages(),
             site.getusersitepackages(), *(p for p in sys.path if "-packages" in p),
             *os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep), *_compiler_dirs()]
    tops = [b[0] for b in binds] + [os.path.realpath(p) for _, p in links]
    seen: list[str] = []
    for p in sorted({os.path.abspath(p) for p in extra if p and os.path.isdir(p)}, key=len):
        # never a directory that holds this checkout (it would show the workspace tools and .git)
        if _under(str(PACKAGE_ROOT), p) or any(_under(p, t) for t in tops + seen):
            continue
        seen.append(p)
    return binds + [[p, p] for p in seen], links


def _spec(tmp: Path, mode: str, argv: list[str], env: dict, cwd: str, device: str,
          shared_cache: Path | None) -> dict:
    """The launcher's instructions (isolate.py) for a jail around `tmp/scratch` and `tmp/impl`."""
    ro, links = _system()
    ro += [[str(RUNTIME), f"{JAIL_RUNTIME}/tik_kernels"], [str(tmp / "impl"), JAIL_IMPL]]
    rw = [[str(tmp / "scratch"), JAIL_SCRATCH]]
    if shared_cache is not None:
        rw.append([str(shared_cache), JAIL_CACHE])
    devices = [d for d in DEVICES if os.path.exists(d)]
    if device.startswith("cuda"):
        devices += sorted(glob.glob("/dev/nvidia*"))
    # the checkout, the workspace and the evaluator's cwd, where a system directory holds them, hidden under
    # an empty tmpfs
    private = {str(PACKAGE_ROOT), os.getcwd(), os.environ.get("TIK_WORKSPACE") or "/"}
    hide = sorted(p for p in private if p != "/" and any(_under(p, src) and p != src for src, _ in ro))
    return {"owner_pid": os.getpid(), "namespaces": True, "uid_mode": mode, "root": str(tmp / "root"), "ro": ro,
            "rw": rw, "symlinks": links, "devices": devices, "hide": hide, "argv": argv, "env": env, "cwd": cwd}


def _stage(job: dict, impl_dir: Path, inside: str) -> dict:
    """The job with its implementation files (and a contract file from outside the runtime) copied under
    `impl_dir` and named as the child sees them (`inside`): the child reads no path of the parent's."""
    impl_dir.mkdir(exist_ok=True)
    staged: list[str] = []

    def put(path: str) -> str:
        src = Path(path)
        staged.append(src.name)
        own = impl_dir / str(len(staged))
        own.mkdir()
        shutil.copyfile(src, own / src.name)
        return f"{inside}/{len(staged)}/{src.name}"

    job = dict(job)
    if "impl" in job:
        job["impl"] = put(job["impl"])
    if "impls" in job:
        job["impls"] = [[name, put(path)] for name, path in job["impls"]]
    if "contract_file" in job:
        src = Path(job["contract_file"]).resolve()
        # a library contract is imported where it lies in the runtime; a test's contract is copied
        if inside == JAIL_IMPL and src.is_relative_to(RUNTIME):
            job["contract_file"] = f"{JAIL_RUNTIME}/tik_kernels/{src.relative_to(RUNTIME)}"
        else:
            job["contract_file"] = put(job["contract_file"])
    return job


# ----------------------------------------------------------------------------- running a child


def limits(timeout: float) -> dict:
    """Resource limits the child sets on itself, a backstop behind the wall-clock kill: CPU seconds
    (several threads may run for the whole wall limit) and address space (CPU device only)."""
    return {"cpu_s": int(timeout * max(4, os.cpu_count() or 1)) + 60, "address_space_bytes": 24 << 30}


@dataclass
class ChildOutcome:
    doc: dict | None
    failure: str | None
    elapsed_s: float
    #: where the parent's time went (seconds): "start" (a spare taken or a child launched, its job staged),
    #: "inputs" (write_inputs), "wait" (until the reply was there), "read" (the reply read and validated); and
    #: "forked", a count: 1.0 when the fork server forked the child, 0.0 when the launcher started it
    phases: dict = field(default_factory=dict)


class _Stopwatch:
    """The parent's phases of one child (`ChildOutcome.phases`): `lap(name)` adds the seconds since the last lap;
    `inputs(write_inputs)` wraps the job's writer so its seconds count as "inputs", not as the lap around it."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self.t = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.t
        self.t = now

    def inputs(self, write_inputs: Callable[[Path], dict]) -> Callable[[Path], dict]:
        def timed(d: Path) -> dict:
            t = time.monotonic()
            try:
                return write_inputs(d)
            finally:
                self.phases["inputs"] = self.phases.get("inputs", 0.0) + time.monotonic() - t
                self.t += time.monotonic() - t  # not counted again in the enclosing lap
        return timed

    def outcome(self, o: ChildOutcome, name: str) -> ChildOutcome:
        self.lap(name)
        o.phases = self.phases
        return o


def _tail(path: Path, n: int = 4000) -> str:
    try:
        data = path.read_bytes()[-n:]
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def _last_error_line(stderr: str) -> str:
    """The error line of the child's last traceback, with where it was raised (file:line in function)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        ln = lines[i]
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b", ln) or "Fatal Python error" in ln:
            frames = (re.match(r'^File "([^"]+)", line (\d+), in (\S+)', x) for x in reversed(lines[:i]))
            where = next((m for m in frames if m), None)
            at = f" (at {Path(where[1]).name}:{where[2]} in {where[3]})" if where else ""
            return (ln[:200] + at)[:300]
    return lines[-1][:200] if lines else ""


def run_child(job: dict, write_inputs: Callable[[Path], dict], read_result: Callable[[Path, dict], Any],
              timeout: float, cache: str = "private", trusted: bool = False) -> ChildOutcome:
    """Run one job in a child. `write_inputs(dir)` adds the job's data files and returns extra job
    fields; `read_result(out_dir, doc)` turns the child's reply into trusted values (may raise
    ProtocolError); `cache` is the child's Triton cache (`triton_cache`). `trusted`: the job runs only the
    library's own code (it may run without the jail where the jail does not start). The job's "impl",
    "impls" and "contract_file" paths are copied for the child. The scratch directory is removed before this
    returns. (`PhasedChild`: one child, two jobs, with the parent's decision between them.)

    A candidate's probes job with a private cache (not `trusted`: an untimed CPU evaluation's, which is nothing
    else) runs in a pre-started child when one is ready (`Spares`), as the first phase of a `PhasedChild` with no
    second: the same jail, limits, checks and reply, without the child's start (Python, torch, Triton: ~1.2 s of
    CPU) on the evaluation's critical path."""
    if job.get("mode") == "probes" and not trusted and cache == "private" and prestart_depth():
        with PhasedChild(job, write_inputs, None, cache=cache) as child:
            return child.first(read_result, timeout)
    t0 = time.monotonic()
    mode, refused = isolation(trusted)
    if refused:
        return ChildOutcome(None, refused, 0.0)
    tmp = _child_tempdir("tik-eval-", mode, job["device"], cache)
    proc = None
    clock = _Stopwatch()
    try:
        proc = _launch(tmp, mode, job, clock.inputs(write_inputs), cache)
        clock.lap("start")
        clock.phases["forked"] = float(isinstance(proc, Forked))
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return ChildOutcome(None, f"timed out after {timeout:g} s (killed)", time.monotonic() - t0, clock.phases)
        # reap anything the candidate left running in its session
        _kill(proc)
        clock.lap("wait")
        failure = _exit_failure(rc, tmp)
        if failure:
            return ChildOutcome(None, failure, time.monotonic() - t0, clock.phases)
        return clock.outcome(_read_reply(tmp / "scratch" / "out", read_result, t0), "read")
    finally:
        if proc is not None and proc.poll() is None:
            _kill(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _launch(tmp: Path, mode: str | None, job: dict, write_inputs: Callable[[Path], dict], cache: str,
            then: dict | None = None) -> subprocess.Popen:
    """Stage the job (and `then`, a second job, see `PhasedChild`) under `tmp` and start the child."""
    scratch = tmp / "scratch"
    (scratch / "work").mkdir(parents=True)
    jailed = mode is not None
    inside = JAIL_IMPL if jailed else str(tmp / "impl")
    # the job's data, like a pre-started child's (`_hand_over`), where the child reads it and cannot write
    box = tmp / "impl" / "job"
    box.mkdir(parents=True)
    job = _job_files({**job, **write_inputs(box)}, box, f"{inside}/job")
    job = _stage(job, tmp / "impl", inside)
    if then is not None:
        # the second job's files are staged now (the implementation directory is mounted when the child starts);
        # the job itself reaches the child only when the parent says so (`PhasedChild.then`)
        (tmp / "impl").mkdir(exist_ok=True)
        (tmp / "then.json").write_text(_dumps(_stage(then, tmp / "impl" / "then", f"{inside}/then")))
        job["next"] = f"{inside}/{NEXT}"
    (scratch / "job.json").write_text(_dumps(job))
    return _start(tmp, mode, job["device"], cache, triton_cache(cache, scratch))[0]


def _start(tmp: Path, mode: str | None, device: str, cache: str,
           cache_dir: Path) -> tuple[subprocess.Popen | Forked, dict]:
    """Start the child staged in `tmp` (its job.json written) in its world (`_world`): the process and its launcher
    spec. Run as "nobody", the child is given its scratch and a cache mounted from outside. A child whose directory
    is in a fork server's pool (`_child_tempdir`) is forked by that server when it still serves this world, else
    started by the launcher like any other."""
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


def _world(tmp: Path, mode: str | None, device: str, cache: str, cache_dir: Path) -> tuple[dict, dict, Path | None]:
    """(environment, launcher spec, cache directory mounted from outside or None) of a child in `tmp`: a function
    of the child's parameters and of this process's state now (its environment, cwd), so a pre-started child's
    world can be compared with the one a child started now would get (`Spares.take`)."""
    scratch = tmp / "scratch"
    here = JAIL_SCRATCH if mode is not None else str(scratch)
    argv = [sys.executable, "-m", "tik_kernels.evaluator.child", here]
    if mode is None:
        env = child_env(device, scratch, cache_dir)
        return env, {"owner_pid": os.getpid(), "namespaces": False, "argv": argv, "env": env,
                     "cwd": str(scratch / "work")}, None
    # the trusted cache and an evaluation's candidate cache outlive the child: mounted, not in its scratch
    shared = cache_dir if cache == "trusted" or not _under(str(cache_dir), str(scratch)) else None
    env = child_env(device, JAIL_SCRATCH, JAIL_CACHE if shared else f"{JAIL_SCRATCH}/triton-cache",
                    runtime=JAIL_RUNTIME)
    env["HOME"] = JAIL_SCRATCH
    return env, _spec(tmp, mode, argv, env, f"{JAIL_SCRATCH}/work", device, shared), shared


def _popen(tmp: Path, env: dict, spec: dict, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    if spec["namespaces"]:
        (tmp / "root").mkdir(exist_ok=True)
    (tmp / "spec.json").write_text(_dumps(spec))
    with open(tmp / "stdout.txt", "wb") as out, open(tmp / "stderr.txt", "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", str(ISOLATE), str(tmp / "spec.json")],
            cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            start_new_session=True, close_fds=True, pass_fds=pass_fds,
        )


def _exit_failure(rc: int, tmp: Path) -> str | None:
    """The one-line failure of a child that exited with status `rc` (None for 0)."""
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        return f"crashed with signal {name}"
    if rc == SETUP_FAILED:
        said = [ln for ln in _tail(tmp / "stderr.txt").splitlines() if ln.startswith("tik-sandbox: ")]
        if said:
            return f"sandbox: {said[-1].removeprefix('tik-sandbox: ')}"[:300]
    if rc != 0:
        line = _last_error_line(_tail(tmp / "stderr.txt"))
        return f"exited with status {rc}" + (f": {line}" if line else "")
    return None


def _read_reply(out: Path, read_result: Callable[[Path, dict], Any], t0: float) -> ChildOutcome:
    """The child's reply in `out` (result.json + data files), through `read_result`."""
    try:
        _plain(out)
        doc = read_json(out / "result.json")
        if not isinstance(doc, dict) or doc.get("done") is not True:
            raise ProtocolError("the child's result is incomplete")
        value = read_result(out, doc)
    except ProtocolError as e:
        return ChildOutcome(None, f"protocol error: {e}", time.monotonic() - t0)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return ChildOutcome(None, f"protocol error: malformed result ({type(e).__name__}: {e})"[:300],
                            time.monotonic() - t0)
    return ChildOutcome(value, None, time.monotonic() - t0)


#: the parent's next step for a `PhasedChild`, in its implementation directory: read-only to the child, so the
#: candidate can neither forge the parent's decision nor make the parent write through a link of its own
NEXT = "next.json"
#: how often the parent looks for the first reply (the child looks for NEXT as often): a few ms per evaluation
POLL_S = 0.01


class PhasedChild:
    """One child, two jobs, the parent deciding in between: the candidate's probes, then (only if the parent says
    so) its timing, in the same process, so an evaluation pays the child's start, CUDA initialisation, imports
    and kernel loading once instead of twice.

    `first` starts the child on `job` and waits (at most its timeout) for its first reply, `out/result.json`;
    the child then waits. The reply directory is moved out of the child's reach (into the parent's own directory,
    which the jail does not mount) before it is read, so the live child cannot change what is read, and it is
    read exactly as `run_child` reads a reply. `then` hands the child the second job (staged when the child
    started: `then_job`), waits for it to exit (at most its own timeout) and reads the second reply the same way;
    `stop` tells it to exit. A child that dies, hangs or lies in either phase is a one-line failure, and the
    child is killed (with anything it started) when the block ends, whatever happened."""

    def __init__(self, job: dict, write_inputs: Callable[[Path], dict], then_job: dict | None, cache: str = "private"):
        self.job, self.write_inputs, self.then_job, self.cache = job, write_inputs, then_job, cache
        self.tmp: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.exited: int | None = None
        #: whether the child was pre-started (`Spares`); a pre-started child's own Triton cache outside its scratch
        #: (None once an evaluation's `candidate_cache` has adopted it)
        self.prestarted = False
        self.own_cache: Path | None = None

    def __enter__(self) -> PhasedChild:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _kill(self.proc)
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if self.own_cache is not None:
            shutil.rmtree(self.own_cache, ignore_errors=True)

    def first(self, read_result: Callable[[Path, dict], Any], timeout: float) -> ChildOutcome:
        t0 = time.monotonic()
        mode, refused = isolation(False)
        if refused:
            return ChildOutcome(None, refused, 0.0)
        clock = _Stopwatch()
        clock.t = t0
        # a child the fork server would fork: a spare is waited for when none is ready or starting (its start is
        # the server's, which a fresh interpreter beside it would only slow down on a loaded CPU, then a warm fork)
        spare = SPARES.take(mode, self.job, self.cache, start=forks(mode, self.job["device"], self.cache)) \
            if prestart_depth() else None
        if spare is not None:
            # a child started (same jail, limits and world) before this candidate existed: it gets its first job now
            self.tmp, self.proc, self.own_cache, self.prestarted = spare.tmp, spare.proc, spare.own_cache, True
            _hand_over(self.tmp, mode, self.job, clock.inputs(self.write_inputs), self.then_job)
        else:
            self.tmp = _child_tempdir("tik-eval-", mode, self.job["device"], self.cache)
            self.proc = _launch(self.tmp, mode, self.job, clock.inputs(self.write_inputs), self.cache,
                                then=self.then_job)
        if prestart_depth():
            # the next candidate's child starts now, while this one runs
            SPARES.prime(mode, self.job["device"], self.job["limits"], self.cache)
        clock.lap("start")
        clock.phases["forked"] = float(isinstance(self.proc, Forked))
        out = self.tmp / "scratch" / "out"
        while (rc := self.proc.poll()) is None and not os.path.lexists(out / "result.json"):
            if time.monotonic() - t0 > timeout:
                _kill(self.proc)
                return ChildOutcome(None, f"timed out after {timeout:g} s (killed)", time.monotonic() - t0,
                                    clock.phases)
            time.sleep(POLL_S)
        if rc is not None:  # it exited without waiting for the parent: its reply is read as run_child reads one
            _kill(self.proc)
            self.exited = rc
            failure = _exit_failure(rc, self.tmp)
            if failure:
                return ChildOutcome(None, failure, time.monotonic() - t0, clock.phases)
        clock.lap("wait")
        taken = self.tmp / "reply-1"
        if os.path.lexists(out):
            try:
                os.rename(out, taken)  # a link named out is moved as a link, and refused by _plain
            except OSError as e:
                return ChildOutcome(None, f"protocol error: its reply could not be taken ({e.strerror})",
                                    time.monotonic() - t0, clock.phases)
        return clock.outcome(_read_reply(taken, read_result, t0), "read")

    def then(self, read_result: Callable[[Path, dict], Any], timeout: float,
             abort: threading.Event | None = None) -> ChildOutcome:
        """`abort`: set by another thread (the parent's checks failed while this job ran: `core.OVERLAP_CHECKS`),
        this call kills the child and returns. Only this call touches the child while it waits."""
        t0 = time.monotonic()
        assert self.proc is not None and self.tmp is not None, "then() before first()"
        rc = self.exited if self.exited is not None else self.proc.poll()
        if rc is not None:
            _kill(self.proc)
            failure = _exit_failure(rc, self.tmp)
            return ChildOutcome(None, (failure + " while waiting") if failure else
                                "exited before it was told to go on", time.monotonic() - t0)
        job = json.loads((self.tmp / "then.json").read_text())
        _write_next(self.tmp / "impl", {"job": job})
        try:
            if abort is None:
                rc = self.proc.wait(timeout=timeout)
            else:
                while (rc := self.proc.poll()) is None:
                    if abort.is_set():
                        _kill(self.proc)
                        return ChildOutcome(None, "stopped: the parent's checks failed", time.monotonic() - t0)
                    if time.monotonic() - t0 > timeout:
                        raise subprocess.TimeoutExpired("child", timeout)
                    time.sleep(POLL_S)
        except subprocess.TimeoutExpired:
            _kill(self.proc)
            return ChildOutcome(None, f"timed out after {timeout:g} s (killed)", time.monotonic() - t0)
        exited_at = time.time()
        _kill(self.proc)
        self.exited = rc
        failure = _exit_failure(rc, self.tmp)
        if failure:
            return ChildOutcome(None, failure, time.monotonic() - t0)
        out = self.tmp / "scratch" / "out"
        # diagnostics: how long the child took to exit after its reply was complete (a CUDA process's teardown),
        # from the reply's own timestamp; and the parent's reading of the reply
        try:
            phases = {"exit": max(0.0, exited_at - os.lstat(out / "result.json").st_mtime)}
        except OSError:
            phases = {}
        t_read = time.monotonic()
        outcome = _read_reply(out, read_result, t0)
        outcome.phases = {**phases, "read": time.monotonic() - t_read}
        return outcome

    def stop(self) -> None:
        """Tell a waiting child to exit, and kill it (a clean exit is a courtesy: nothing waits on it long)."""
        if self.proc is None or self.proc.poll() is not None or self.tmp is None:
            return self.close()
        _write_next(self.tmp / "impl", {"stop": True})
        try:
            self.proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        _kill(self.proc)  # what it left running in its session too
        self.close()


def _write_next(impl: Path, doc: dict, name: str = NEXT) -> None:
    """Atomically: the child never reads half a decision."""
    part = impl / f".{name}.part"
    part.write_text(_dumps(doc))
    os.replace(part, impl / name)


# ----------------------------------------------------------------------------- pre-started children


#: how many pre-started candidate children (`Spares`) the evaluator keeps ready per (device, cache mode); 0 turns
#: them off. Off suits a process that evaluates once (its spare would only compete with the evaluation for the
#: CPU, hold a CUDA context, and be killed at exit unused) and tests that count the children an evaluation starts.
PRESTART_ENV = "TIK_PRESTART"
#: a spare older than this is not used but killed, and a fresh child started: an idle child should not hold its
#: memory (a CUDA context) for ever; the child itself gives up waiting a minute later
SPARE_MAX_AGE_S = 600.0
#: at most this long an evaluation waits for a spare that is being started (`Spares.take`, `Spares.settle`)
SETTLE_S = 60.0
#: the spares' pending count of a fork server being started early (`Spares.serve_early`), beside the cache modes
SERVER = "server"
#: the cache modes a spare can serve ("trusted" children run the root, never a candidate)
SPARE_CACHES = ("private", "seeded", "candidate")
#: a pre-started child's first job, written by the parent into its implementation directory (as NEXT is)
START = "start.json"
#: a pre-started child writes this in its scratch once started (imports done, device initialised) and removes it
#: when it takes its job: read only to wait until a starting child has gone quiet (`Spares.settle`), never to decide
READY = "ready"


def prestart_depth() -> int:
    v = os.environ.get(PRESTART_ENV, "").strip()
    return int(v) if v.isdigit() else 1


@dataclass
class Spare:
    """A candidate child started before its candidate existed, waiting for its first job (`START`)."""

    tmp: Path
    proc: subprocess.Popen
    key: tuple  # (uid mode, device, cache mode, limits)
    spec: dict  # the launcher's spec: environment, mounts, hidden paths, cwd
    cache_dir: Path
    own_cache: Path | None  # a "candidate" cache: its directory outside the scratch
    born: float

    def discard(self) -> None:
        _kill(self.proc)
        shutil.rmtree(self.tmp, ignore_errors=True)
        if self.own_cache is not None:
            shutil.rmtree(self.own_cache, ignore_errors=True)


class Spares:
    """The pre-started candidate children of this process: a candidate's child starts (Python, torch, Triton, the
    harness, the CUDA context: seconds) while the previous candidate is evaluated, not on its own critical path.

    A spare is the child `PhasedChild` would start, started earlier: the same launcher, jail, scrubbed environment,
    rlimits (set at its start from the limits of the evaluation that asked for it) and an empty scratch directory;
    it imports what a child imports, initialises its device, then waits, running nothing else, until the parent
    writes its first job into its read-only implementation directory. From then on it is a `PhasedChild` like any
    other (the same phases, timeouts, checks and reply). Each serves one candidate and is never reused. `take` uses
    one only if it is alive, younger than SPARE_MAX_AGE_S and its world (uid mode, device, cache mode, limits, and
    the spec a child started now would get: environment, mounts, hidden paths) is the evaluation's; any other is
    killed and its directories removed. Spares are started by one long-lived thread (a launcher dies with the thread
    that started it: PR_SET_PDEATHSIG), killed at exit (atexit), and die with this process however it ends (the
    launcher's PDEATHSIG chain); `reap_stale` removes what a killed evaluator left (the directories are owned).

    The Triton cache: a "private" spare has its own empty cache in its scratch, as any child. A "candidate" spare
    cannot share its evaluation's cache (`candidate_cache`), which does not exist yet: it gets a seeded copy of the
    trusted cache of its own, outside its scratch, topped up with what the trusted cache gained since when it is
    taken, and the evaluation's `candidate_cache` adopts it, so the evaluation's later candidate children share it
    and the next evaluation does not see it; an evaluation that already has a candidate cache takes no spare."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.cond = threading.Condition()
        self.ready: dict[tuple[str, str], list[Spare]] = {}
        self.pending: dict[tuple[str, str], int] = {}
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.closed = False
        self.stats = {"started": 0, "taken": 0, "discarded": 0, "failed": 0}

    def _mine(self) -> None:
        """A forked copy of this process starts with none (its parent's spares are not its children), and with a
        lock of its own (the parent's may have been held by another thread when it forked). Called first, unlocked."""
        if self.owner != os.getpid():
            self.__init__()

    def take(self, mode: str | None, job: dict, cache: str, start: bool = False) -> Spare | None:
        """A spare fit for this child, now in the caller's hands, or None (then start one the usual way). `start`:
        when none fits and none is starting, start one (`prime`) and wait for it (`forks`: where that costs no more
        than starting the child the usual way)."""
        if cache not in SPARE_CACHES:
            return None
        holder = _CANDIDATE_CACHE.get() if cache == "candidate" else None
        if holder:  # this evaluation already has its candidate cache: a spare's would be another
            return None
        slot, key = (job["device"], cache), (mode, job["device"], cache, _dumps(job["limits"]))
        deadline = time.monotonic() + SETTLE_S
        self._mine()
        for attempt in (0, 1):
            with self.cond:
                while self.pending.get(slot) and time.monotonic() < deadline:
                    self.cond.wait(0.05)  # one being started: it is nearly ready, a fresh child is not
                spares = self.ready.pop(slot, [])
            chosen, keep, drop = None, [], []
            for s in spares:
                if not self._fits(s, mode, key):
                    drop.append(s)
                elif chosen is None:
                    chosen = s
                else:
                    keep.append(s)
            with self.cond:
                self.ready.setdefault(slot, [])[:0] = keep
                self.stats["discarded"] += len(drop)
                self.stats["taken"] += chosen is not None
            for s in drop:
                s.discard()
            if chosen is not None or not start or attempt:
                break
            self.prime(mode, job["device"], job["limits"], cache)
        if chosen is not None and cache != "private":
            _top_up(chosen.cache_dir, mode)
        if chosen is not None and holder is not None and chosen.own_cache is not None:
            holder.append(chosen.own_cache)  # the evaluation's candidate cache from now on (removed with it)
            chosen.own_cache = None
        return chosen

    @staticmethod
    def _fits(s: Spare, mode: str | None, key: tuple) -> bool:
        if s.proc.poll() is not None or time.monotonic() - s.born >= SPARE_MAX_AGE_S or s.key != key:
            return False
        return _world(s.tmp, mode, key[1], key[2], s.cache_dir)[1] == s.spec

    def prime(self, mode: str | None, device: str, limits: dict, cache: str) -> None:
        """Start spares in the background until prestart_depth() fit for such a child are ready or starting."""
        if cache not in SPARE_CACHES:
            return
        slot, key = (device, cache), (mode, device, cache, _dumps(limits))
        self._mine()
        with self.cond:
            if self.closed:
                return
            spares = self.ready.pop(slot, [])
            self.ready[slot] = [s for s in spares if s.key == key]
            drop = [s for s in spares if s.key != key]
            want = prestart_depth() - len(self.ready[slot]) - self.pending.get(slot, 0)
            self.stats["discarded"] += len(drop)
            if want > 0:
                self.pending[slot] = self.pending.get(slot, 0) + want
                self._thread()
        for s in drop:
            s.discard()
        for _ in range(max(0, want)):
            self.queue.put((mode, device, limits, cache))

    def serve_early(self, mode: str, device: str) -> None:
        """Start the fork server for `device`'s children in the background now (`prepare`), unless it is up."""
        self._mine()
        with self.cond:
            if self.closed:
                return
            self.pending[(device, SERVER)] = self.pending.get((device, SERVER), 0) + 1  # `settle` waits for it too
            self._thread()
        self.queue.put((mode, device, None, None))

    def _thread(self) -> None:
        """The spares' thread, started once (called with the lock held)."""
        if self.thread is None:
            import atexit

            self.thread = threading.Thread(target=self._run, name="tik-spares", daemon=True)
            self.thread.start()
            atexit.register(self.close)

    def _run(self) -> None:
        while (req := self.queue.get()) is not None:
            mode, device, limits, cache = req
            if limits is None:  # `serve_early`: the fork server only
                try:
                    if not self.closed:
                        SERVERS.ensure(mode, device, "private")
                except Exception:  # a head start only: this thread must live on for the spares
                    self.stats["failed"] += 1
                with self.cond:
                    self.pending[(device, SERVER)] -= 1
                    self.cond.notify_all()
                continue
            spare = None
            if not self.closed:
                try:
                    spare = _spawn_spare(mode, device, limits, cache)
                except Exception:  # it only costs the speed-up: the next evaluation starts its own child
                    self.stats["failed"] += 1
            with self.cond:
                self.pending[(device, cache)] -= 1
                if spare is not None and not self.closed:
                    self.ready.setdefault((device, cache), []).append(spare)
                    self.stats["started"] += 1
                    spare = None
                self.cond.notify_all()
            if spare is not None:
                spare.discard()

    def settle(self, device: str, limit_s: float = SETTLE_S) -> float:
        """Wait (at most `limit_s`) until no spare for `device` is starting: a GPU is timed without a CUDA context
        being created beside it. The seconds waited."""
        t0 = time.monotonic()
        self._mine()
        while time.monotonic() - t0 < limit_s:
            with self.cond:
                busy = any(n for (d, _), n in self.pending.items() if d == device) or any(
                    s.proc.poll() is None and not (s.tmp / "scratch" / READY).exists()
                    for (d, _), v in self.ready.items() if d == device for s in v)
            if not busy:
                break
            time.sleep(POLL_S)
        return time.monotonic() - t0

    def pids(self) -> list[int]:
        """The launcher pids of the spares ready now (for tests and benchmarks)."""
        with self.cond:
            return [s.proc.pid for v in self.ready.values() for s in v]

    def close(self) -> None:
        """Kill every spare and remove its directories (atexit); spares being started are discarded when they are."""
        if self.owner != os.getpid():
            return
        with self.cond:
            self.closed = True
            spares = [s for v in self.ready.values() for s in v]
            self.ready.clear()
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join(timeout=SETTLE_S)
        for s in spares:
            s.discard()


#: this process's spares
SPARES = Spares()


def forks(mode: str | None, device: str, cache: str) -> bool:
    """Whether such a child is one a fork server forks (jailed, CPU, a private Triton cache; `forkserver.wanted`)."""
    return mode is not None and cache == "private" and forkserver.wanted(device)


def prepare(device: str) -> None:
    """An evaluator process that will evaluate candidates on `device` starts what their children need now, in the
    background: on the CPU, the fork server (`zygote.py`: Python, torch, Triton and the harness imported and warmed,
    ~1.5 s of CPU), so the first candidate's child is forked from it as every later one is, instead of a fresh
    interpreter started beside the server. Nothing when the children would not be forked (GPU, no jail, or
    TIK_FORK_SERVER=0) or spares are off (TIK_PRESTART=0)."""
    mode = isolation(trusted=False)[0]
    if prestart_depth() and forks(mode, device, "private"):
        SPARES.serve_early(mode, device)


def settle_spares(device: str) -> float:
    """`SPARES.settle(device)`: the seconds waited until no spare for `device` is starting."""
    return SPARES.settle(device)


def _spawn_spare(mode: str | None, device: str, limits: dict, cache: str) -> Spare:
    """Start a child that waits for its first job (`child._prestarted`) in a new scratch directory (in this thread,
    which lives as long as the process: the fork server is started here when this child is one it would serve)."""
    SERVERS.ensure(mode, device, cache)
    tmp = _child_tempdir("tik-spare-", mode, device, cache)
    own = None
    try:
        scratch = tmp / "scratch"
        (scratch / "work").mkdir(parents=True)
        (tmp / "impl").mkdir()
        inside = JAIL_IMPL if mode is not None else str(tmp / "impl")
        (scratch / "job.json").write_text(_dumps({"mode": "spare", "device": device, "limits": limits,
                                                  "start": f"{inside}/{START}", "idle_s": SPARE_MAX_AGE_S + 60}))
        if cache == "candidate":
            own = owned_tempdir("tik-cand-triton-")
            cache_dir = _seeded(own / "triton-cache")
        else:
            cache_dir = triton_cache(cache, scratch)
        proc, spec = _start(tmp, mode, device, cache, cache_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)
        raise
    return Spare(tmp, proc, (mode, device, cache, _dumps(limits)), spec, cache_dir, own, time.monotonic())


def _top_up(cache_dir: Path, mode: str | None) -> None:
    """Copy into a spare's seeded cache what the trusted cache gained since it was seeded (the spare has run no
    candidate yet: nothing of its own is there to trust or distrust)."""
    if _TRUSTED_CACHE is None or not _TRUSTED_CACHE.is_dir():
        return
    for entry in _TRUSTED_CACHE.iterdir():
        dst = cache_dir / entry.name
        if entry.name.startswith("tmp.") or os.path.lexists(dst):
            continue
        if entry.is_dir():
            shutil.copytree(entry, dst)
        else:
            shutil.copyfile(entry, dst)
        if mode == "nobody":
            _give(dst)


def _hand_over(tmp: Path, mode: str | None, job: dict, write_inputs: Callable[[Path], dict],
               then: dict | None) -> None:
    """A spare's first job (and its second, `then`, staged as `_launch` stages it): the job's files, its inputs and
    the job itself under its implementation directory, which the child reads and cannot write; START last."""
    inside = JAIL_IMPL if mode is not None else str(tmp / "impl")
    box = tmp / "impl" / "job"
    box.mkdir()
    job = _job_files({**job, **write_inputs(box)}, box, f"{inside}/job")
    job = _stage(job, box, f"{inside}/job")
    if then is not None:
        (tmp / "then.json").write_text(_dumps(_stage(then, tmp / "impl" / "then", f"{inside}/then")))
        job["next"] = f"{inside}/{NEXT}"
    _write_next(tmp / "impl", {"job": job}, START)


def _job_files(job: dict, box: Path, inside: str) -> dict:
    """The job with the files its write_inputs left in `box` (read-only to the child) named as the child sees them:
    its inputs, and the socket its reply's shared memory goes over (`protocol.SharedOutputs`)."""
    if (box / "inputs.bin").exists():
        job["inputs"] = f"{inside}/inputs.bin"
    if (box / "reply.sock").is_socket():
        job["reply_socket"] = f"{inside}/reply.sock"
    return job


# ----------------------------------------------------------------------------- the fork server


#: where a fork server's pool is in its jail (zygote.POOL)
JAIL_POOL = "/tik/pool"
#: environment variables a fork server's world key leaves out (`_world_key`)
VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})


def _world_key(mode: str | None, device: str) -> str:
    """The world a private-cache child started now would get (`_world`), its directories left out: a fork server
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
    the launcher's PDEATHSIG chain); their directories are owned (`reap_stale`)."""

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


def _plain(out: Path) -> None:
    """The child's reply must be plain files in a plain directory: a symlink there would make this process read
    a file of its own choosing (a key, the workspace) as the child's result."""
    if not out.exists() and not out.is_symlink():
        return
    if out.is_symlink() or not out.is_dir():
        raise ProtocolError("the child's output directory is not a directory")
    for p in out.iterdir():
        if p.is_symlink() or not p.is_file():
            raise ProtocolError(f"the child's output {p.name[:40]!r} is not a plain file")


def _kill(proc: subprocess.Popen | Forked) -> None:
    if isinstance(proc, Forked):
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        return
    kill_group(proc)


def _dumps(doc: dict) -> str:
    return json.dumps(doc)
