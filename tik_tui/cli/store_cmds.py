"""`tik init | log | show | status | approve | reject | doctor`: the commands that read and decide on the IR."""

from __future__ import annotations

import argparse
import contextlib
import functools
import getpass
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from tik_store import STATUSES, Workspace, WorkspaceError
from tik_store.errors import ReadOnlyWorkspace
from tik_tui.agent.pricing import money, unpriced_use
from tik_tui.cli.common import TikError, common_parent, impl_id, print_json
from tik_tui.verdict import cell_limit, cell_ratio, cell_vs_incumbent, explain, objective_ratio, x


def _user() -> str:
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        return "user"


def _handler(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Store errors become one-line `TikError`s."""

    @functools.wraps(fn)
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except WorkspaceError as e:
            raise TikError(str(e)) from None

    return run


def _open(args: argparse.Namespace, *, readonly: bool = False) -> Workspace:
    """`readonly` for the commands that only read (log, show, status): they never wait on a writer's lock,
    and never import GitPython unless a source they show is packed."""
    return Workspace.open(Path(args.workspace), readonly=readonly)


def _color(text: str, code: str) -> str:
    if not sys.stdout.isatty() or os.environ.get("NO_COLOR"):
        return text
    return f"\033[{code}m{text}\033[0m"


def _fmt(v: float | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:.4g}{unit}"


def _first_line(text: str, width: int = 60) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


# ---------------------------------------------------------------------------------------------- init


def seed(ws: Workspace) -> list[dict]:
    """One root implementation per operator that has a contract, promoted by `library` (the initial
    incumbent). Operators whose contract or root file is not importable are reported on stderr."""
    from tik_kernels.contracts import all_contracts

    seeded = []
    for op, c in all_contracts().items():
        try:
            path = c.root_path
            source = path.read_text()
        except (FileNotFoundError, OSError) as e:
            print(f"tik: warning: {op}: no root implementation ({e}); not seeded", file=sys.stderr)
            continue
        ws.ensure_operator(op, c.summary, c.describe(), c.fingerprint())
        impl_id = ws.add_implementation(op, source, proposer="root", rationale=f"the library's root ({c.impl})",
                                        filename=path.name, status="promoted")
        ws.decide(impl_id, "promote", by="library", reason="initial incumbent: the library's root implementation")
        seeded.append({"op": op, "root": impl_id, "file": str(path)})
    return seeded


@_handler
def cmd_init(args: argparse.Namespace) -> int:
    with Workspace.init(Path(args.workspace)) as ws:
        seeded = seed(ws)
    if args.json:
        print_json({"workspace": str(args.workspace), "operators": seeded})
    else:
        ops = ", ".join(s["op"] for s in seeded) or "none yet"
        print(f"initialized TIK workspace {args.workspace}: {len(seeded)} operator root(s) seeded ({ops})")
    return 0


# ---------------------------------------------------------------------------------------------- log


def _write_json_list(batches: Iterable[list]) -> None:
    """`json.dumps(every row)` and a newline, byte for byte, written a batch at a time (the C encoder; an
    indented dump is pure Python, ~10x slower on 10,000 rows)."""
    encode = json.JSONEncoder(default=str).encode
    sep = "["
    for batch in batches:
        if batch:
            sys.stdout.write(sep + encode(batch)[1:-1])
            sep = ", "
    sys.stdout.write("[]\n" if sep == "[" else "]\n")


def _known_op(ws: Workspace, op: str | None) -> str | None:
    if op is not None:
        ops = [o["op"] for o in ws.operators()]
        if op not in ops:
            raise TikError(f"no operator {op!r} in this workspace (it has: {', '.join(ops) or 'none'})")
    return op


@_handler
def cmd_log(args: argparse.Namespace) -> int:
    with _open(args, readonly=True) as ws, contextlib.closing(
            ws.iter_implementations(op=_known_op(ws, args.op), status=args.status)) as batches:
        # closed before the workspace is, also when the reader goes away mid-listing (`tik log | head`)
        if args.json:
            _write_json_list(batches)
            return 0
        header = True
        roots: dict[str, tuple] = {}
        for batch in batches:
            if header:
                print(f"{'id':>6}  {'op':<12} {'parents':<10} {'status':<10} {'proposer':<10} {'×root':>7}  "
                      "rationale")
                header = False
            ratios = _root_ratios(ws, batch, roots)
            for r in batch:
                parents = ",".join(map(str, r["parents"])) or "-"
                status = _color(f"{r['status']:<10}", _STATUS_COLOR.get(r["status"], "0"))
                print(f"{r['id']:>6}  {r['op']:<12} {parents:<10} {status} {r['proposer']:<10} "
                      f"{_ratio(ratios.get(r['id'])):>7}  {_first_line(r['rationale'])}")
    if header:
        print("no derivations" + (f" of {args.op}" if args.op else ""))
    return 0


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.3f}×"


def _root_ratios(ws: Workspace, rows: list[dict], roots: dict[str, tuple]) -> dict[int, float]:
    """Each row's time ×root as the UI computes it: its objective over the root's recorded objective, else
    over the root's timing in the row's own run (one query per batch). `roots`: op -> (root id, root
    objective), filled as operators are met."""
    out: dict[int, float] = {}
    need: list[int] = []
    for r in rows:
        if r["op"] not in roots:
            root = ws.root(r["op"])
            roots[r["op"]] = (None, None) if root is None else (root["id"], root["objective"])
        root_id, root_obj = roots[r["op"]]
        if r["id"] == root_id:
            out[r["id"]] = 1.0
        elif r["status"] in ("failed", "candidate"):
            continue
        elif r["objective"] is not None and root_obj:
            out[r["id"]] = float(r["objective"]) / float(root_obj)
        else:
            need.append(r["id"])
    if need:
        marks = ",".join("?" * len(need))
        for m in ws.db.query(
                "SELECT m.impl_id AS id, sum(coalesce(m.coeff, 1) * m.median_us) AS obj, "
                "sum(coalesce(m.coeff, 1) * m.root_median_us) AS root, count(m.root_median_us) = count(*) AS whole "
                f"FROM measurements m WHERE m.impl_id IN ({marks}) AND m.batch = "
                "(SELECT max(batch) FROM measurements WHERE impl_id = m.impl_id) GROUP BY m.impl_id", need):
            if m["whole"] and m["obj"] is not None and m["root"]:
                out[m["id"]] = m["obj"] / m["root"]
    return out


_STATUS_COLOR = {"failed": "31", "verified": "36", "eligible": "33", "promoted": "32;1", "rejected": "2"}


# ---------------------------------------------------------------------------------------------- show


def _render_diff(diff: str) -> str:
    out = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            out.append(_color(line, "1"))
        elif line.startswith("@@"):
            out.append(_color(line, "36"))
        elif line.startswith("+"):
            out.append(_color(line, "32"))
        elif line.startswith("-"):
            out.append(_color(line, "31"))
        else:
            out.append(line)
    return "\n".join(out)


@_handler
def cmd_show(args: argparse.Namespace) -> int:
    with _open(args, readonly=True) as ws:
        impl = ws.implementation(args.id)
        doc = {**impl, "source": ws.source(args.id), "diff": ws.diff(args.id), "checks": ws.checks(args.id),
               "measurements": ws.measurements(args.id), "evaluations": ws.evaluations(args.id),
               "lineage": [r["id"] for r in ws.lineage(args.id)], "children": [r["id"] for r in ws.children(args.id)]}
    if args.json:
        print_json(doc)
        return 0
    parents = ", ".join(f"#{p}" for p in doc["parents"]) or "none (root)"
    print(_color(f"#{doc['id']}  {doc['op']}  {doc['status']}", "1") + f"  by {doc['proposer']}  {doc['created']}")
    print(f"parents: {parents}   lineage: {' > '.join(f'#{i}' for i in doc['lineage'])}   "
          f"children: {', '.join(f'#{c}' for c in doc['children']) or '-'}")
    print(f"commit {doc['commit']}  ({doc['filename']})")
    if doc["objective"] is not None:
        vs = objective_ratio(doc)
        print(f"objective {_fmt(doc['objective'], ' us')}  (incumbent {_fmt(doc['incumbent_objective'], ' us')} in "
              "the same run" + (f": {x(vs, 'incumbent')})" if vs is not None else ")"))
    why = explain(doc, doc["measurements"])
    print(_color(f"why {doc['status']}: {why}", _STATUS_COLOR.get(doc["status"], "0")) if why != doc["status"]
          else f"status: {why}")
    if doc["rationale"]:
        print("\nrationale:\n  " + doc["rationale"].strip().replace("\n", "\n  "))
    m = doc["modification"]
    if m:
        print(f"\nchange: +{m['lines_added']} -{m['lines_removed']} lines; "
              f"functions: {', '.join(m['functions_changed']) or '-'}")
        if m.get("expected_effect"):
            print(f"expected effect: {m['expected_effect']}")
        if m.get("numerical_risks"):
            print(f"numerical risks: {m['numerical_risks']}")
    u = doc["usage"]
    if u["calls"]:
        model = (m or {}).get("model")
        print(f"LLM: {u['calls']} call(s), {u['input_tokens']} in / {u['output_tokens']} out tokens "
              f"({u['cache_read_tokens']} cache read), cost {money(u['cost_usd'], unpriced_use({model: u}))}"
              + (f" ({model})" if model else ""))
    for d in doc["decisions"]:
        print(f"decision: {d['action']} by {d['by']} at {d['created']}" + (f": {d['reason']}" if d["reason"] else ""))
    if doc["checks"]:
        print("\nchecks:")
        for c in doc["checks"]:
            mark = _color("PASS", "32") if c["passed"] else _color("FAIL", "31")
            print(f"  {mark} {c['name']:<40} max_diff {_fmt(c['max_diff'])}  {_first_line(c['detail'], 50)}")
    if doc["measurements"]:
        print("\nmeasurements (us; ratios are time over the reference's in the same run, below 1 is faster):")
        w = max(28, *(len(str(c["cell"])) for c in doc["measurements"]))
        print(f"  {'cell':<{w}} {'median':>9} {'spread':>8} {'root':>9} {'×root':>7} {'limit':>7} {'×incumb.':>8} "
              f"{'×torch':>7}")
        for c in doc["measurements"]:
            r, lim = cell_ratio(c), cell_limit(c)
            flag = _color(" over its limit", "31") if r is not None and lim is not None and r > lim else ""
            print(f"  {c['cell']:<{w}} {_fmt(c['median_us']):>9} {_fmt(c['spread_us']):>8} "
                  f"{_fmt(c['root_median_us']):>9} {_ratio(r):>7} {_ratio(lim):>7} "
                  f"{_ratio(cell_vs_incumbent(c)):>8} {_ratio(c['ratio_vs_baseline']):>7}{flag}")
        env = doc["measurements"][0]["env"]
        print(f"  on {env.get('gpu') or env.get('device')}, driver {env.get('driver')}, "
              f"torch {env.get('torch')}, triton {env.get('triton')}")
    if args.diff:
        print("\ndiff to " + (f"#{doc['parent']}:" if doc["parent"] else "the empty file (root):"))
        print(_render_diff(doc["diff"]))
    else:
        print(f"\nsource ({doc['filename']}):")
        print(doc["source"].rstrip("\n"))
    return 0


# ---------------------------------------------------------------------------------------------- status


@_handler
def cmd_status(args: argparse.Namespace) -> int:
    with _open(args, readonly=True) as ws:
        ops = [o["op"] for o in ws.operators()]
        counts = {s: 0 for s in STATUSES}
        for r in ws.db.query("SELECT status, count(*) AS n FROM implementations GROUP BY status"):
            counts[r["status"]] = r["n"]
        incumbents = {}
        for op in ops:
            inc = ws.incumbent(op)
            incumbents[op] = None if inc is None else {"id": inc["id"], "objective": inc["objective"],
                                                       "proposer": inc["proposer"]}
        doc = {"workspace": str(args.workspace), "worker": ws.worker_state(), "usage": ws.llm_usage_totals(),
               "counts": counts, "incumbents": incumbents, "queue": ws.promotion_queue()}
    if args.json:
        print_json(doc)
        return 0
    w = doc["worker"]
    alive = "alive" if w["alive"] else "not running"
    budget = f"budget {w['budget']:g}, spent {w['spent'] or 0:g}" if w.get("budget") is not None else "no budget set"
    print(f"workspace {doc['workspace']}")
    print(f"worker: {w['state']} ({alive})" + (f", pid {w['pid']}" if w.get("pid") else "")
          + (f", {w['op']}" if w.get("op") else "") + (f", proposer {w['proposer']}" if w.get("proposer") else "")
          + f"; {budget}" + (f" — {w['message']}" if w.get("message") else ""))
    u = doc["usage"]
    print(f"LLM spend: {money(u['cost_usd'], unpriced_use(u.get('by_model')))} over {u['calls']} call(s), "
          f"{u['input_tokens']} in / {u['output_tokens']} out tokens")
    print("derivations: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) if any(counts.values())
          else "derivations: none")
    print("incumbents:")
    for op, inc in incumbents.items():
        print(f"  {op:<14} " + ("-" if inc is None else f"#{inc['id']} ({inc['proposer']}) "
                                                         f"objective {_fmt(inc['objective'], ' us')}"))
    if not doc["queue"]:
        print("promotion queue: empty")
    else:
        print("promotion queue (tik approve ID / tik reject ID --reason TEXT):")
        for r in doc["queue"]:
            ratio = (f"{r['objective'] / r['incumbent_objective']:.3f}× incumbent"
                     if r["objective"] and r["incumbent_objective"] else "")
            print(f"  #{r['id']:<5} {r['op']:<14} {ratio}  {_first_line(r['rationale'], 50)}")
    return 0


# ---------------------------------------------------------------------------------------------- decide


def _queued(ws: Workspace, impl_id: int) -> dict:
    impl = ws.implementation(impl_id)
    if impl_id not in {r["id"] for r in ws.promotion_queue()}:
        raise TikError(f"#{impl_id} is not in the promotion queue (it is {impl['status']}"
                       + (", already decided" if impl["decisions"] else "") + ")")
    return impl


@_handler
def cmd_approve(args: argparse.Namespace) -> int:
    with _open(args) as ws:
        impl = _queued(ws, args.id)
        did = ws.decide(args.id, "promote", by=_user(), reason=args.reason or "")
    if args.json:
        print_json({"id": args.id, "op": impl["op"], "action": "promote", "decision": did, "status": "promoted"})
    else:
        print(f"promoted #{args.id}: now the {impl['op']} incumbent (tag promoted/{impl['op']}/{args.id})")
    return 0


@_handler
def cmd_reject(args: argparse.Namespace) -> int:
    with _open(args) as ws:
        impl = _queued(ws, args.id)
        did = ws.decide(args.id, "reject", by=_user(), reason=args.reason)
    if args.json:
        print_json({"id": args.id, "op": impl["op"], "action": "reject", "decision": did, "status": "rejected"})
    else:
        print(f"rejected #{args.id} ({impl['op']}): {args.reason}")
    return 0


# ---------------------------------------------------------------------------------------------- doctor


@_handler
def cmd_doctor(args: argparse.Namespace) -> int:
    try:
        ws = _open(args)
    except ReadOnlyWorkspace:
        if args.repair:
            raise
        # a viewer without write access can still see what is wrong
        ws = _open(args, readonly=True)
    with ws:
        problems = ws.doctor()
        repairs = ws.reconcile() if args.repair else []
        remaining = ws.doctor() if args.repair else problems
    if args.json:
        print_json({"healthy": not remaining, "problems": problems, "repairs": repairs, "remaining": remaining})
    else:
        for p in problems:
            print(f"problem: {p}")
        for r in repairs:
            print(f"repaired: {r}")
        if args.repair:
            for p in remaining:
                print(f"still wrong: {p}")
        if not remaining:
            print("workspace healthy" if not problems else "workspace repaired")
        elif not args.repair:
            print(f"{len(problems)} problem(s); `tik doctor --repair` fixes what can be fixed without loss")
    return 0 if not remaining else 1


# ---------------------------------------------------------------------------------------------- register


def register(sub: argparse._SubParsersAction) -> None:
    parent = [common_parent()]
    p = sub.add_parser("init", parents=parent, help="create a workspace seeded with every operator's root")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("log", parents=parent, help="list derivations")
    p.add_argument("--op", help="only this operator")
    p.add_argument("--status", choices=STATUSES, help="only this status")
    p.set_defaults(func=cmd_log)

    p = sub.add_parser("show", parents=parent, help="one derivation: source, diff, checks, measurements")
    p.add_argument("id", type=impl_id, metavar="ID")
    p.add_argument("--diff", action="store_true", help="show the diff to the first parent instead of the source")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("status", parents=parent, help="worker state, spend, incumbents, promotion queue")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("approve", parents=parent, help="promote a queued derivation")
    p.add_argument("id", type=impl_id, metavar="ID")
    p.add_argument("--reason", default="", help="why (recorded with the decision)")
    p.set_defaults(func=cmd_approve)

    p = sub.add_parser("reject", parents=parent, help="reject a queued derivation")
    p.add_argument("id", type=impl_id, metavar="ID")
    p.add_argument("--reason", required=True, help="why (recorded with the decision)")
    p.set_defaults(func=cmd_reject)

    p = sub.add_parser("doctor", parents=parent, help="check the workspace; --repair fixes what it can")
    p.add_argument("--repair", action="store_true", help="reconcile git and the database (nothing is dropped)")
    p.set_defaults(func=cmd_doctor)
