"""A researcher's plug-in: a constraint added to apportion's cell formulation and a policy
of one's own, each a few lines, registered through entry points (see pyproject.toml).

* ``cells-two-starts`` (policy ``apportion-two-starts``): the cell formulation with at most
  two new jobs started per round. Every answer a round may use, the greedy floor
  included, is checked against the model's rows, so the constraint holds whichever
  backend answers.
* ``largest-first``: place the biggest requests first on their requested GPU type.

Install with ``pip install examples/research_plugin``; then ``apportion policies`` lists
both, ``solve-round --formulation cells-two-starts`` and ``simulate --policy
largest-first`` run them, and ``apportion.testing`` checks them.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from apportion.decision import Decision
from apportion.formulations.schema import cells_of, current_cells, jobs_in
from apportion.policies.base import Choice, Packer, build_decision, requested_type
from apportion.policies.recipes import RECIPES, Recipe
from apportion.view import View

MAX_STARTS = 2


def two_starts_model(g: Any, cfg: Any) -> Any:
    """The cells model plus one row: at most MAX_STARTS cells of queued jobs chosen."""
    model = RECIPES["cells"].model(g, cfg)
    running = {g.nodes[c]["job"] for c in current_cells(g)}
    cols = model.meta["cell_cols"]
    starts = {cols[c]: 1.0 for j in jobs_in(g) if j not in running for c in cells_of(g, j)}
    if starts:
        model.add_row(starts, ub=float(MAX_STARTS), name="at-most-two-starts")
    return model


def recipe() -> Recipe:
    return replace(RECIPES["cells"], name="cells-two-starts", policy="apportion-two-starts",
                   doc=f"cells, at most {MAX_STARTS} new starts per round", model=two_starts_model,
                   partitions=False)


class LargestFirst:
    """Place the biggest requests first, each on its requested GPU type (or its best)."""

    name = "largest-first"

    def decide(self, view: View) -> Decision:
        t0 = time.perf_counter()
        packer, chosen = Packer(view.cluster), {}
        for js in sorted(view.jobs, key=lambda j: -j.spec.requested_gpus):
            gpu_type, rate = requested_type(view, js)
            place = packer.place(gpu_type, js.spec.requested_gpus) if gpu_type else None
            if place is not None:
                chosen[js.id] = Choice(gpu_type, js.spec.requested_gpus, place, rate)
        return build_decision(view, chosen, self.name, t0, {})
