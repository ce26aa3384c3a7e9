"""`tik export`: the incumbent (or an id) written back as an implementation file."""

import json

from agent_helpers import fake_eval, make_toy_workspace

from tik_tui.cli.main import main
from tik_tui.worker import run_search


def test_export_incumbent_and_id(tmp_path, capsys):
    ws, root = make_toy_workspace(tmp_path / "ws")
    s = run_search(ws.path, proposer="tuner", budget=4, auto_promote=True, evaluate=fake_eval.evaluate)
    inc = ws.incumbent("toy")
    assert inc["id"] != root and inc["id"] in s["derivations"]
    out = tmp_path / "out"
    assert main(["-w", str(ws.path), "export", "toy", "--to", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["id"] == inc["id"] and (out / "toy.py").read_text() == ws.source(inc["id"])
    assert main(["-w", str(ws.path), "export", "toy", str(root), "--to", str(out)]) == 0
    assert (out / "toy.py").read_text() == ws.source(root)
    ws.close()


def test_export_refuses_unverified_and_unknown(tmp_path, capsys):
    ws, root = make_toy_workspace(tmp_path / "ws")
    bad = ws.add_implementation("toy", "def toy(x):\n    return x  # BROKEN\n", parents=[root], proposer="t")
    ws.set_status(bad, "failed", detail="broken")
    out = tmp_path / "out"
    w = str(ws.path)
    assert main(["-w", w, "export", "toy", str(bad), "--to", str(out)]) == 2
    assert "failed" in capsys.readouterr().err and not (out / "toy.py").exists()
    assert main(["-w", w, "export", "toy", str(bad), "--to", str(out), "--force"]) == 0
    assert main(["-w", w, "export", "toy", "999", "--to", str(out)]) == 2
    assert "no implementation #999" in capsys.readouterr().err
    assert main(["-w", w, "export", "nope", "--to", str(out)]) == 2
    ws.close()


def test_export_without_a_promotion(tmp_path, capsys):
    from agent_helpers import TOY_CONTRACT, TOY_SOURCE

    from tik_store import Workspace

    ws = Workspace.init(tmp_path / "ws")
    ws.ensure_operator("toy", "identity", TOY_CONTRACT, "fp")
    ws.add_implementation("toy", TOY_SOURCE, proposer="root", status="verified")
    assert main(["-w", str(ws.path), "export", "toy", "--to", str(tmp_path / "o")]) == 2
    assert "no promoted implementation of toy" in capsys.readouterr().err
    ws.close()
