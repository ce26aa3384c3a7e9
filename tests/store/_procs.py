"""Child processes for the store's concurrency and crash tests: `python _procs.py ROLE WORKSPACE ARG...`.

Each prints one JSON document on stdout. Only `store` is imported (no torch), so they start fast.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tik_store import Workspace  # noqa: E402
from tik_store.gitrepo import GitRepo  # noqa: E402


def source(tag: str, i: int) -> str:
    return f"CONFIG = {{'BLOCK': {i}}}\nTAG = {tag!r}\n\n\ndef toy(x):\n    return x * {i}\n"


def report(objective: float, verified: bool = True, eligible: bool = False) -> dict:
    return {"verified": verified, "eligible": eligible, "objective": objective, "incumbent_objective": 50.0,
            "admissible": verified, "failure": None if verified else "deterministic",
            "checks": [{"name": "deterministic", "requirement": "deterministic", "passed": verified, "detail": "",
                        "max_diff": 0.0}],
            "cells": [{"cell": "T=1", "coeff": 1.0, "limit": 0.05, "median_us": objective, "spread_us": 0.1,
                       "samples": 5}],
            "env": {"device": "cpu", "torch": "x", "triton": "y"}}


def writer(ws_path: str, tag: str, n: int, root: int) -> dict:
    """n implementations (children of random earlier ones of this writer) and n events."""
    rng = random.Random(tag)
    mine = [root]
    with Workspace.open(ws_path) as ws:
        for i in range(n):
            impl = ws.add_implementation("toy", source(tag, i), parents=[rng.choice(mine)], proposer=tag,
                                         rationale=f"{tag} {i}")
            ws.record_evaluation(impl, report(rng.uniform(1, 100)))
            mine.append(impl)
            ws.append_event("writer", {"tag": tag, "i": i}, op="toy", impl_id=impl)
    return {"ids": mine[1:]}


def soak_writer(ws_path: str, seconds: float, root: int) -> dict:
    """Derivations (some merges, some failing) for `seconds`; returns every id written."""
    rng = random.Random(7)
    good, ids = [root], []
    end = time.time() + seconds
    with Workspace.open(ws_path) as ws:
        i = 0
        while time.time() < end:
            parents = rng.sample(good, 2) if len(good) > 2 and rng.random() < 0.1 else [rng.choice(good)]
            impl = ws.add_implementation("toy", source("soak", i), parents=parents, proposer="soak",
                                         rationale=f"soak {i}", usage={"model": "m", "input_tokens": i,
                                                                       "output_tokens": 1, "cost_usd": 0.001})
            ok = rng.random() < 0.8
            ws.record_evaluation(impl, report(rng.uniform(1, 100), verified=ok))
            if ok:
                good.append(impl)
            ids.append(impl)
            i += 1
    return {"ids": ids}


def soak_reader(ws_path: str, seconds: float) -> dict:
    """Poll like a viewer; every derivation seen must be whole: parents visible, source readable and matching
    its hash, lineage reaching a root, its creation event present."""
    bad: list[str] = []
    seen: set[int] = set()
    created: set[int] = set()
    last_event, polls = 0, 0
    end = time.time() + seconds
    with Workspace.open(ws_path) as ws:
        while time.time() < end or polls == 0:
            polls += 1
            # rows first, then events: a row's creation event commits with it, so it must be there by now
            rows = ws.implementations(op="toy")
            for e in ws.events_since(last_event, limit=1_000_000):
                if e["id"] <= last_event:
                    bad.append(f"event {e['id']} out of order")
                last_event = e["id"]
                if e["kind"] == "implementation":
                    created.add(e["impl_id"])
            visible = {r["id"] for r in rows}
            for r in rows:
                if r["id"] in seen:
                    continue
                if r["id"] not in created:
                    bad.append(f"#{r['id']} visible without its event")
                if not set(r["parents"]) <= visible:
                    bad.append(f"#{r['id']} visible before its parents")
                src = ws.source(r["id"])
                if hashlib.sha256(src.encode()).hexdigest() != r["source_sha256"]:
                    bad.append(f"#{r['id']} source does not match its hash")
                chain = ws.lineage(r["id"])
                if chain[0]["parents"] or chain[-1]["id"] != r["id"]:
                    bad.append(f"#{r['id']} lineage broken")
                seen.add(r["id"])
            time.sleep(0.01)
    return {"seen": len(seen), "polls": polls, "bad": bad[:20]}


def kill_between_git_and_db(ws_path: str, parent: int) -> None:
    """Record a derivation, dying (SIGKILL) after its commit and pending ref are written, before any row."""
    Workspace._insert_implementation = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    with Workspace.open(ws_path) as ws:
        ws.add_implementation("toy", source("crash", 1), parents=[parent], proposer="claude",
                              rationale="fuse the epilogue", modification={"expected_effect": "1.2x"},
                              usage={"model": "claude-x", "input_tokens": 1234, "output_tokens": 56, "cost_usd": 0.5})


def kill_between_db_and_ref(ws_path: str, parent: int) -> None:
    """Record a derivation, dying after its rows are committed, before refs/derivations/<id> is written."""
    real = GitRepo.set_ref

    def set_ref(self, ref, target):
        if ref.startswith("refs/derivations/"):
            os.kill(os.getpid(), signal.SIGKILL)
        real(self, ref, target)

    GitRepo.set_ref = set_ref
    with Workspace.open(ws_path) as ws:
        ws.add_implementation("toy", source("crash", 2), parents=[parent], proposer="tuner", rationale="BLOCK 2")


def kill_during_promotion(ws_path: str, impl: int) -> None:
    """Promote, dying after the tag is written, before the decision row."""
    Workspace._tx = lambda self: os.kill(os.getpid(), signal.SIGKILL)
    with Workspace.open(ws_path) as ws:
        ws.decide(impl, "promote", by="alice", reason="2x faster")


if __name__ == "__main__":
    role, ws_path, *rest = sys.argv[1:]
    if role == "writer":
        out = writer(ws_path, rest[0], int(rest[1]), int(rest[2]))
    elif role == "soak_writer":
        out = soak_writer(ws_path, float(rest[0]), int(rest[1]))
    elif role == "soak_reader":
        out = soak_reader(ws_path, float(rest[0]))
    else:
        out = globals()[role](ws_path, int(rest[0]))
    print(json.dumps(out))
