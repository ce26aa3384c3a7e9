"""Parent selection and the admissibility limits: a verified node with a cell past its limit (it can never be
promoted, nor can anything derived from it unless the move is undone) is not expanded ahead of the root."""

import math

from tik_tui.agent import select
from tik_tui.agent.select import excess, select_parent


class _Store:
    """The store calls select_parent makes, over two frontier nodes: the root (#1, one derivation made from it)
    and #2, faster on the mean of its cells but with one cell 1.36x the root's time (limit 1.05x)."""

    def __init__(self):
        self.rows = {1: {"id": 1, "status": "promoted", "parent_id": None},
                     2: {"id": 2, "status": "verified", "parent_id": 1}}
        self.cells = {1: [{"cell": c, "ratio_vs_root": 1.0, "limit": 0.05} for c in "abc"],
                      2: [{"cell": "a", "ratio_vs_root": 0.80, "limit": 0.05},
                          {"cell": "b", "ratio_vs_root": 0.80, "limit": 0.05},
                          {"cell": "c", "ratio_vs_root": 1.36, "limit": 0.05}]}

    def frontier(self, op):
        return list(self.rows.values())

    def attempts(self, op):
        return [self.rows[2]]

    def opportunities(self, op):
        return []

    def measurements(self, impl_id):
        return self.cells[impl_id]


def test_excess_is_the_log_of_the_worst_cell_past_its_limit():
    s = _Store()
    assert excess(s.cells[1]) == 0.0
    assert math.isclose(excess(s.cells[2]), math.log(1.36 / 1.05))
    assert excess([{"ratio_vs_root": 1.2}]) == 0.0  # no limit recorded: nothing to hold it against


def test_a_node_past_a_cells_limit_is_not_expanded_ahead_of_the_root(monkeypatch):
    s = _Store()
    assert select_parent(s, "op").parent["id"] == 1
    monkeypatch.setattr(select, "OVER", 0.0)  # without the term the unexplored, faster-on-the-mean node wins
    assert select_parent(s, "op").parent["id"] == 2
