"""The candidate sandbox: whether untrusted children may run here, and the jail each child runs in. A child is a fresh
interpreter (fork+exec of the launcher, never a fork of this process) in a jail (`isolate.py`: new user, pid, mount,
network, IPC and UTS namespaces) with a scrubbed environment; this module holds the policy, what a child sees, its
scratch directory, its Triton cache and its launcher. What is built on it lives beside it, each part importing only
the parts below it: the fork servers that fork CPU children instead of launching them (`servers.py`), the children
started before their candidate existed (`spares.py`), and running a job in a child and reading its reply back
(`spawn.py`: `run_child`, `PhasedChild`).

What the child sees (`_spec`): the system directories and Python read-only, the trusted runtime it imports
(this checkout's `tik_kernels/`, read-only at /tik/runtime), the implementation files of its job (copies,
read-only at /tik/impl), its own scratch directory read-write at /tmp, the GPU device nodes and a fresh /proc
of its own pid namespace. Not the workspace, not the rest of the checkout, not the parent's processes, no
network. Where the kernel refuses the namespaces, untrusted children do not run (`isolation`), unless the
caller opted out: `evaluate(..., sandbox=False)`, or `TIK_UNSAFE_NO_SANDBOX=1`, which `--unsafe-no-sandbox`
sets.

Every scratch directory is named after its owner (`owned_tempdir`: evaluator pid and start time), so a later
process can tell a dead evaluator's leftovers from a live one's and remove them (`reap_stale`).
"""

from __future__ import annotations

import contextlib
import contextvars
import glob
import json
import os
import re
import shutil
import signal
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import tik_kernels
from tik_kernels.evaluator.forkserver import Forked, kill_group

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
    `spawn.PhasedChild`) is such a child, and where probes and timing run in separate children (a timing child of
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


def _world(tmp: Path, mode: str | None, device: str, cache: str, cache_dir: Path) -> tuple[dict, dict, Path | None]:
    """(environment, launcher spec, cache directory mounted from outside or None) of a child in `tmp`: a function
    of the child's parameters and of this process's state now (its environment, cwd), so a pre-started child's
    world can be compared with the one a child started now would get (`spares.Spares.take`)."""
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


# ----------------------------------------------------------------------------- starting and stopping a child


def limits(timeout: float) -> dict:
    """Resource limits the child sets on itself, a backstop behind the wall-clock kill: CPU seconds
    (several threads may run for the whole wall limit) and address space (CPU device only)."""
    return {"cpu_s": int(timeout * max(4, os.cpu_count() or 1)) + 60, "address_space_bytes": 24 << 30}


#: how often the parent looks at a child's files: a `spawn.PhasedChild`'s first reply (the child looks for its
#: `spawn.NEXT` as often), a starting spare's `spares.READY`; a few ms per evaluation
POLL_S = 0.01


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


def _kill(proc: subprocess.Popen | Forked) -> None:
    if isinstance(proc, Forked):
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        return
    kill_group(proc)


def _dumps(doc: dict) -> str:
    return json.dumps(doc)
