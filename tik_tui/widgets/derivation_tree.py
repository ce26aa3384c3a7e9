"""Operators → their derivation trees. Children are added when a node is first expanded, so a
workspace of 10,000 derivations costs one node per operator at first paint; new derivations
appear live under parents that are already loaded."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from tik_tui.widgets import format as fmt
from tik_tui.widgets.model import Snapshot, parent_of

#: `f` cycles through these; None shows everything
FILTERS = (None, "promoted", "eligible", "verified", "failed", "rejected", "candidate")


class DerivationTree(Tree):
    """Node data: `("op", name)` for an operator, the implementation id (int) for a derivation."""

    BINDINGS = [
        Binding("f", "cycle_filter", "Filter", id="tree.filter", tooltip="Show only one status (and ancestors)"),
        Binding("e", "expand_op", "Expand all", id="tree.expand", tooltip="Expand the whole tree under the cursor"),
    ]

    DEFAULT_CSS = "DerivationTree { height: 1fr; }"

    def __init__(self, **kwargs):
        super().__init__("derivations", **kwargs)
        self.show_root = False
        # enter opens the detail; space (or a click on the arrow) expands
        self.auto_expand = False
        self.guide_depth = 2
        self.snap = Snapshot()
        self.status_filter: str | None = None
        self.evaluating: set[int] = set()
        self._impl_nodes: dict[int, TreeNode] = {}
        self._op_nodes: dict[str, TreeNode] = {}
        self._loaded: set[int | str] = set()
        self._labels: dict[int | str, Text] = {}
        self._kids: dict[int | None, list[int]] = {}
        self._tops: dict[str, list[int]] = {}
        self._visible: set[int] | None = None
        #: id -> what its label depends on, so that a refresh relabels only what changed
        self._sigs: dict[int, tuple] = {}
        self._seen: set[int] = set()
        #: up to this many derivations, new ones are revealed (their ancestors expanded) as they arrive
        self.reveal_limit = 2000
        self._counts: dict[str, int] = {}

    # -- data -------------------------------------------------------------------------------
    def update_from(self, snap: Snapshot, evaluating: set[int] | None = None) -> None:
        self.snap = snap
        self.evaluating = set(evaluating or ())
        self._index()
        for op in snap.op_names:
            if op not in self._op_nodes:
                # one level open at first paint: the operator's root(s), whatever the tree's size
                self._op_nodes[op] = self.root.add(self._op_label(op), data=("op", op), allow_expand=True,
                                                   expand=bool(self._tops.get(op)))
                self._loaded.add(op)
            else:
                self._relabel(op, self._op_nodes[op], self._op_label(op))
        for key in list(self._loaded):
            self._add_missing_children(key)
        # while the workspace is small, open the path to each new derivation so it shows up live
        if self._seen and len(snap.impls) <= self.reveal_limit:
            for i in sorted(set(snap.impls) - self._seen):
                self.reveal(i)
        self._seen = set(snap.impls)
        for i, node in self._impl_nodes.items():
            if i in snap.impls:
                sig = self._signature(i)
                if self._sigs.get(i) != sig:
                    self._sigs[i] = sig
                    self._relabel(i, node, self._impl_label(i))
                node.allow_expand = bool(self._children_of(i))

    def _index(self) -> None:
        kids: dict[int | None, list[int]] = {}
        tops: dict[str, list[int]] = {}
        counts: dict[str, int] = {}
        for i in sorted(self.snap.impls):
            row = self.snap.impls[i]
            counts[row.get("op")] = counts.get(row.get("op"), 0) + 1
            p = parent_of(row)
            if p is None or p not in self.snap.impls:
                tops.setdefault(row.get("op"), []).append(i)
            else:
                kids.setdefault(p, []).append(i)
        self._kids, self._tops, self._counts = kids, tops, counts
        self._visible = None
        if self.status_filter is not None:
            visible: set[int] = set()
            for i in list(self.snap.impls):
                if self._status(i) == self.status_filter:
                    while i is not None and i not in visible:
                        visible.add(i)
                        i = parent_of(self.snap.impls[i]) if i in self.snap.impls else None
            self._visible = visible

    def _signature(self, i: int) -> tuple:
        row, op = self.snap.impls[i], self.snap.impls[i].get("op")
        return (self._status(i), self.snap.ratios.get(i), row.get("proposer"),
                self.snap.roots.get(op) == i, self.snap.incumbents.get(op) == i)

    def _status(self, i: int) -> str:
        status = self.snap.impls[i].get("status")
        return "evaluating" if status == "candidate" and i in self.evaluating else status

    def _children_of(self, key: int | str) -> list[int]:
        ids = self._tops.get(key, []) if isinstance(key, str) else self._kids.get(key, [])
        return ids if self._visible is None else [i for i in ids if i in self._visible]

    def _add_missing_children(self, key: int | str) -> None:
        parent = self._op_nodes.get(key) if isinstance(key, str) else self._impl_nodes.get(key)
        if parent is None:
            return
        for i in self._children_of(key):
            if i not in self._impl_nodes:
                self._impl_nodes[i] = parent.add(self._impl_label(i), data=i, allow_expand=bool(self._children_of(i)))

    def _relabel(self, key, node: TreeNode, label: Text) -> None:
        if self._labels.get(key) != label:
            self._labels[key] = label
            node.set_label(label)

    def _op_label(self, op: str) -> Text:
        n = self._counts.get(op, 0)
        inc = self.snap.incumbents.get(op)
        t = Text(op, style="bold")
        t.append(f"  {n} derivation{'s' if n != 1 else ''}", style="dim")
        if inc is not None and inc != self.snap.roots.get(op):
            t.append(f"  incumbent #{inc}", style="green")
            r = self.snap.incumbent_ratio(op)
            if r:
                t.append(f" {r:.3f}× root", style="bold green")
        return t

    def _impl_label(self, i: int) -> Text:
        row = self.snap.impls[i]
        status = self._status(i)
        style = fmt.STATUS_STYLE.get(status, "")
        t = Text(f"{fmt.STATUS_MARK.get(status, '?')} #{i} ", style=style)
        t.append(f"{status:<10}", style=style)
        ratio = self.snap.ratios.get(i)
        t.append_text(fmt.ratio_text(ratio) if ratio is not None else Text("   —  ", style="dim"))
        t.append(f"  {row.get('proposer') or ''}", style="dim")
        op = row.get("op")
        if self.snap.roots.get(op) == i:
            t.append("  [root]", style="bold blue")
        if self.snap.incumbents.get(op) == i:
            t.append("  [incumbent]", style="bold green")
        return t

    # -- events -----------------------------------------------------------------------------
    def on_tree_node_expanded(self, event: Tree.NodeExpanded) -> None:
        key = event.node.data[1] if isinstance(event.node.data, tuple) else event.node.data
        if key not in self._loaded:
            self._loaded.add(key)
            self._add_missing_children(key)

    def reveal(self, i: int) -> TreeNode | None:
        """Load and expand the path from the operator to derivation `i` (the cursor stays)."""
        if i not in self.snap.impls:
            return None
        path = []
        j: int | None = i
        while j is not None and j in self.snap.impls:
            path.append(j)
            j = parent_of(self.snap.impls[j])
        op = self.snap.impls[i].get("op")
        keys: list[int | str] = [op, *reversed(path[1:])]
        for key in keys:
            self._loaded.add(key)
            self._add_missing_children(key)
            node = self._op_nodes.get(key) if isinstance(key, str) else self._impl_nodes.get(key)
            if node is not None:
                node.expand()
        return self._impl_nodes.get(i)

    def action_cycle_filter(self) -> None:
        self.status_filter = FILTERS[(FILTERS.index(self.status_filter) + 1) % len(FILTERS)]
        self.rebuild()
        self.notify(f"tree: showing {self.status_filter or 'all statuses'}", timeout=2)

    def action_expand_op(self) -> None:
        node = self.cursor_node or (self.root.children[0] if self.root.children else None)
        if node is None:
            return
        stack = [node]
        while stack:
            n = stack.pop()
            key = n.data[1] if isinstance(n.data, tuple) else n.data
            if key is not None and key not in self._loaded:
                self._loaded.add(key)
                self._add_missing_children(key)
            n.expand()
            stack.extend(n.children)

    def rebuild(self) -> None:
        """Start over (after a filter change); with a filter, open the paths to the matches."""
        self.clear()
        self._impl_nodes.clear()
        self._op_nodes.clear()
        self._loaded.clear()
        self._labels.clear()
        self._sigs.clear()
        self.update_from(self.snap, self.evaluating)
        if self._visible is not None and len(self._visible) <= 500:
            for op, node in self._op_nodes.items():
                if self._children_of(op):
                    self._loaded.add(op)
                    self._add_missing_children(op)
                    node.expand()
            for i in sorted(self._visible):
                self._loaded.add(i)
                self._add_missing_children(i)
                if i in self._impl_nodes:
                    self._impl_nodes[i].expand()
