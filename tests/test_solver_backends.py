"""Every solver backend derives from :class:`apportion.solvers.base.Backend`, which declares
what a chain asks of a backend (its tolerance and stall rule, an LP kept across rounds, a
work budget), so the chain calls methods instead of probing attributes."""

from __future__ import annotations

import pytest
from apportion.solvers.base import BACKEND_CLASSES, Backend
from apportion.solvers.chain_rules import HIGHS_STALL_SHARE, for_chain
from apportion.solvers.isolation import IsolatedBackend, resolve_backend


@pytest.mark.parametrize("name", sorted(BACKEND_CLASSES))
def test_every_backend_is_a_backend_and_takes_the_chains_tolerance(name: str) -> None:
    backend = resolve_backend(name)
    assert isinstance(backend, Backend) and backend.name == name
    for_chain(backend, 0.05)
    # a backend with a tolerance of its own takes the chain's; CP-SAT has none
    assert getattr(backend, "mip_rel_gap", 0.05) == 0.05
    assert getattr(backend, "stall_share", HIGHS_STALL_SHARE) == HIGHS_STALL_SHARE
    assert isinstance(IsolatedBackend(name), Backend)


def test_a_class_that_is_not_a_backend_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"collections:OrderedDict: not a solver backend"):
        resolve_backend("collections:OrderedDict")
