"""Spawning the child: a fresh interpreter (fork+exec, never a fork that keeps running parent code),
its own session, a private temporary directory as cwd, a scrubbed environment, a hard timeout
that kills the whole process group, and the result read back through `protocol`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tik_kernels
from tik_kernels.evaluator.protocol import ProtocolError, read_json

#: variables the child never sees, whatever their value
SECRET = re.compile(r"(^ANTHROPIC_|KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|^AWS_|^GH_|^GITHUB_)", re.I)
#: the package root, so `python -m tik_kernels.evaluator.child` imports this checkout from any cwd
PACKAGE_ROOT = Path(tik_kernels.__file__).resolve().parent.parent


#: compiled kernels of trusted children (the root's probes) in this evaluator process, see `triton_cache`
_TRUSTED_CACHE: Path | None = None


def trusted_cache_dir() -> Path:
    global _TRUSTED_CACHE
    if _TRUSTED_CACHE is None:
        import atexit

        _TRUSTED_CACHE = Path(tempfile.mkdtemp(prefix="tik-trusted-triton-"))
        atexit.register(shutil.rmtree, _TRUSTED_CACHE, True)
    return _TRUSTED_CACHE


def triton_cache(mode: str, tmp: Path) -> Path:
    """The Triton cache directory of a child. "private": empty, its own. "trusted": the process's shared
    directory, which only children running trusted code (the root) get, so they alone write it. "seeded": a
    private copy of the shared directory: a candidate that keeps most of the root's kernels (a tuner changing
    one tile bucket) loads them instead of compiling them again (Triton's key is the kernel's source and
    constants, not the file), and what it writes or deletes stays in its copy."""
    if mode not in ("private", "trusted", "seeded"):
        raise ValueError(f"unknown cache mode {mode!r}")
    if mode == "trusted":
        return trusted_cache_dir()
    own = tmp / "triton-cache"
    if mode == "seeded" and _TRUSTED_CACHE is not None and _TRUSTED_CACHE.is_dir():
        shutil.copytree(_TRUSTED_CACHE, own, dirs_exist_ok=True, ignore=shutil.ignore_patterns("tmp.*"))
    return own


def child_env(device: str, tmp: Path, cache_dir: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not SECRET.search(k)}
    env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["TMPDIR"] = str(tmp)
    # a private Triton cache (or a private copy of the trusted one): a candidate cannot plant compiled kernels
    # another evaluation would load
    env["TRITON_CACHE_DIR"] = str(cache_dir or tmp / "triton-cache")
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def limits(timeout: float) -> dict:
    """Resource limits the child sets on itself, a backstop behind the wall-clock kill: CPU seconds
    (several threads may run for the whole wall limit) and address space (CPU device only)."""
    return {"cpu_s": int(timeout * max(4, os.cpu_count() or 1)) + 60, "address_space_bytes": 24 << 30}


@dataclass
class ChildOutcome:
    doc: dict | None
    failure: str | None
    elapsed_s: float


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
              timeout: float, cache: str = "private") -> ChildOutcome:
    """Run one job in a child. `write_inputs(dir)` adds the job's data files and returns extra job
    fields; `read_result(out_dir, doc)` turns the child's reply into trusted values (may raise
    ProtocolError); `cache` is the child's Triton cache (`triton_cache`). The temporary directory is
    removed before this returns."""
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="tik-eval-"))
    proc = None
    try:
        job = {**job, **write_inputs(tmp)}
        (tmp / "job.json").write_text(_dumps(job))
        work = tmp / "work"
        work.mkdir()
        with open(tmp / "stdout.txt", "wb") as out, open(tmp / "stderr.txt", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tik_kernels.evaluator.child", str(tmp)],
                cwd=work, env=child_env(job["device"], tmp, triton_cache(cache, tmp)), stdin=subprocess.DEVNULL,
                stdout=out, stderr=err,
                start_new_session=True, close_fds=True,
            )
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill(proc)
                return ChildOutcome(None, f"timed out after {timeout:g} s (killed)", time.monotonic() - t0)
        # reap anything the candidate left running in its session
        _kill(proc)
        if rc < 0:
            name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
            return ChildOutcome(None, f"crashed with signal {name}", time.monotonic() - t0)
        if rc != 0:
            line = _last_error_line(_tail(tmp / "stderr.txt"))
            return ChildOutcome(None, f"exited with status {rc}" + (f": {line}" if line else ""),
                                time.monotonic() - t0)
        try:
            doc = read_json(tmp / "out" / "result.json")
            if not isinstance(doc, dict) or doc.get("done") is not True:
                raise ProtocolError("the child's result is incomplete")
            value = read_result(tmp / "out", doc)
        except ProtocolError as e:
            return ChildOutcome(None, f"protocol error: {e}", time.monotonic() - t0)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            return ChildOutcome(None, f"protocol error: malformed result ({type(e).__name__}: {e})"[:300],
                                time.monotonic() - t0)
        return ChildOutcome(value, None, time.monotonic() - t0)
    finally:
        if proc is not None and proc.poll() is None:
            _kill(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _dumps(doc: dict) -> str:
    import json

    return json.dumps(doc)
