"""The operators' contracts: one module per operator, each defining `CONTRACT`.

Frozen, trusted code: no derivation edits a contract, loosens a tolerance or drops a shape.
Discovered by listing this package, so adding an operator touches no shared file.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from tik_kernels.contract import Contract

#: the order operators are listed in (others follow alphabetically)
ORDER = ("embedding", "rmsnorm", "add_rmsnorm", "rope", "linear", "silu_mul", "attention", "logprob", "entropy",
         "sample")


class UnknownOperator(KeyError):
    def __str__(self) -> str:
        return f"unknown operator {self.args[0]!r} (known: {', '.join(all_contracts())})"


@cache
def all_contracts() -> dict[str, Contract]:
    found: dict[str, Contract] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        contract = getattr(mod, "CONTRACT", None)
        if isinstance(contract, Contract):
            found[contract.op] = contract
    rank = {op: i for i, op in enumerate(ORDER)}
    return dict(sorted(found.items(), key=lambda kv: (rank.get(kv[0], len(ORDER)), kv[0])))


def get_contract(op: str) -> Contract:
    contracts = all_contracts()
    if op not in contracts:
        raise UnknownOperator(op)
    return contracts[op]
