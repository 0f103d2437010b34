"""The solver-neutral model every formulation builds and every backend consumes.

A :class:`LinearModel` holds variables (bounds, integrality, a hashable key each),
sparse linear rows ``lb <= a.x <= ub``, a linear objective with a sense, an
optional warm-start hint, and a ``decode`` callable that turns a solution vector
back into the formulation's answer. Keeping this type free of any solver lets a
researcher inspect, edit or export a problem before choosing a backend, and lets
``solvers`` stay ignorant of formulation internals.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice, repeat
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from scipy import sparse

INF = math.inf


class Columns(NamedTuple):
    """A constraint matrix in compressed sparse columns (the names scipy gives them)."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray


@dataclass
class Row:
    """One linear constraint ``lb <= sum(coef * x[var]) <= ub``."""

    name: str
    coeffs: dict[int, float]
    lb: float
    ub: float


@dataclass
class LinearModel:
    """Variables, sparse rows, objective, hint and decoder of one problem."""

    name: str
    sense: str = "max"  # "max" or "min"
    var_keys: list[Hashable] = field(default_factory=list)
    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    obj: list[float] = field(default_factory=list)
    obj_constant: float = 0.0
    rows: list[Row] = field(default_factory=list)
    hint: dict[int, float] = field(default_factory=dict)
    decode: Callable[[np.ndarray], Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    _index: dict[Hashable, int] = field(default_factory=dict, repr=False)
    # the rows as arrays (row lengths, columns, coefficients), made once per set of rows:
    # a round reads them many times (each backend's matrix, every answer's row check, LP
    # rounding's fill), and gathering them from the row dicts is most of that time. Keyed
    # by what an append changes; rows are never edited in place (add a row, or build anew)
    _arrays: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    # -- building ---------------------------------------------------------------
    def add_var(
        self,
        key: Hashable,
        lb: float = 0.0,
        ub: float = INF,
        integer: bool = False,
        obj: float = 0.0,
    ) -> int:
        """Add a variable under ``key`` and return its column index."""
        if key in self._index:
            raise ValueError(f"duplicate variable key {key!r}")
        if lb > ub:
            raise ValueError(f"variable {key!r}: lb {lb} > ub {ub}")
        idx = len(self.var_keys)
        self._index[key] = idx
        self.var_keys.append(key)
        self.lb.append(float(lb))
        self.ub.append(float(ub))
        self.integer.append(bool(integer))
        self.obj.append(float(obj))
        return idx

    def add_vars(self, columns: Iterable[tuple[Hashable, float, float, bool, float]]) -> range:
        """Add variables ``(key, lb, ub, integer, obj)`` in order, as many :meth:`add_var`
        calls would (the same checks; nothing is added when one fails), and return their
        column indices: a builder that makes tens of thousands of columns a round."""
        cols = list(columns)
        if not cols:
            return range(len(self.var_keys), len(self.var_keys))
        keys, lb, ub, integer, obj = zip(*cols)
        return self.add_columns(keys, lb, ub, integer, obj)

    def add_columns(self, keys: Sequence[Hashable], lb: Iterable[float], ub: Iterable[float],
                    integer: Iterable[bool], obj: Iterable[float]) -> range:
        """:meth:`add_vars` with each field in a sequence of its own (equally long): a
        builder whose columns share bounds and costs hands them as ``itertools.repeat``
        and makes one tuple per column, its key (the cell model's placement columns)."""
        start = len(self.var_keys)
        fresh = dict(zip(keys, range(start, start + len(keys))))
        if len(fresh) != len(keys) or not self._index.keys().isdisjoint(fresh):
            seen: set[Hashable] = set()
            for key in keys:
                if key in self._index or key in seen:
                    raise ValueError(f"duplicate variable key {key!r}")
                seen.add(key)
        n = len(keys)
        lbs, ubs = list(map(float, islice(lb, n))), list(map(float, islice(ub, n)))
        ints, objs = list(map(bool, islice(integer, n))), list(map(float, islice(obj, n)))
        if not len(lbs) == len(ubs) == len(ints) == len(objs) == n:
            raise ValueError(f"{n} keys, {len(lbs)} lower bounds, {len(ubs)} upper bounds, "
                             f"{len(ints)} integralities and {len(objs)} costs")
        if any(map(operator.gt, lbs, ubs)):
            i = next(i for i, (a, b) in enumerate(zip(lbs, ubs)) if a > b)
            raise ValueError(f"variable {keys[i]!r}: lb {lbs[i]} > ub {ubs[i]}")
        self._index.update(fresh)
        self.var_keys.extend(keys)
        self.lb.extend(lbs)
        self.ub.extend(ubs)
        self.integer.extend(ints)
        self.obj.extend(objs)
        return range(start, start + len(keys))

    def binary(self, key: Hashable, obj: float = 0.0) -> int:
        return self.add_var(key, 0.0, 1.0, True, obj)

    def index(self, key: Hashable) -> int:
        return self._index[key]

    def positions(self, keys: Iterable[Hashable]) -> np.ndarray:
        """The column of each of ``keys`` (-1 where this model has no such variable): how
        a solver that kept an earlier model matches its columns to this one's."""
        # map over the dict's own get: no Python frame per key (a replay's round matches
        # tens of thousands)
        return np.fromiter(map(self._index.get, keys, repeat(-1)), np.int64)

    def add_row(
        self,
        coeffs: Mapping[int, float] | Iterable[tuple[int, float]],
        lb: float = -INF,
        ub: float = INF,
        name: str = "",
    ) -> int:
        """Add ``lb <= sum coeffs <= ub``; repeated columns are summed."""
        n = len(self.var_keys)
        if isinstance(coeffs, Mapping):  # columns already unique: one pass
            merged = {c: float(v) for c, v in coeffs.items()}
        else:
            merged = {}
            for col, val in coeffs:
                merged[col] = merged.get(col, 0.0) + float(val)
        bad = [c for c in merged if not 0 <= c < n]
        if bad:
            raise IndexError(f"row {name!r}: no column {bad[0]}")
        if 0.0 in merged.values():
            merged = {c: v for c, v in merged.items() if v != 0.0}
        self.rows.append(Row(name or f"r{len(self.rows)}", merged, float(lb), float(ub)))
        return len(self.rows) - 1

    def add_rows(self, rows: Iterable[tuple[dict[int, float], float, float, str]]) -> range:
        """Add rows ``(coeffs, lb, ub, name)`` in order, as many :meth:`add_row` calls with
        a mapping would (the same checks; nothing is added when one fails), and return
        their indices: a builder that makes thousands of rows a round. The ``coeffs``
        dicts become the rows' own (not copied): the caller hands them over."""
        given = list(rows)
        n = len(self.var_keys)
        start = len(self.rows)
        made = []
        for coeffs, lb, ub, name in given:
            if coeffs and not (0 <= min(coeffs) and max(coeffs) < n):
                bad = next(c for c in coeffs if not 0 <= c < n)
                raise IndexError(f"row {name!r}: no column {bad}")
            if 0.0 in coeffs.values():
                coeffs = {c: v for c, v in coeffs.items() if v != 0.0}
            made.append(Row(name or f"r{start + len(made)}", coeffs, float(lb), float(ub)))
        self.rows.extend(made)
        return range(start, start + len(made))

    def set_hint(self, values: Mapping[int, float] | np.ndarray) -> None:
        """A (possibly partial) starting solution handed to backends that take one: a
        mapping of columns to values, or a whole solution vector (converted in numpy: a
        chain sets every answer as the next backend's start)."""
        if isinstance(values, np.ndarray):
            self.hint = dict(enumerate(values.astype(float).ravel().tolist()))
        else:
            self.hint = {int(k): float(v) for k, v in values.items()}

    # -- reading ----------------------------------------------------------------
    @property
    def num_vars(self) -> int:
        return len(self.var_keys)

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def matrix(self) -> sparse.csr_matrix:
        """The constraint matrix as CSR (rows x columns, column indices sorted)."""
        from scipy import sparse  # here: a round whose solver runs in a child never loads it

        lens, indices, data = self.entries()
        indptr = np.zeros(len(self.rows) + 1, np.int64)
        np.cumsum(lens, out=indptr[1:])
        m = sparse.csr_matrix((data.copy(), indices.copy(), indptr),
                              shape=(self.num_rows, self.num_vars))
        m.sort_indices()
        return m

    def columns(self) -> Columns:
        """The constraint matrix column by column (CSC: ``indptr``, row ``indices`` sorted
        within a column, ``data``), in numpy alone, cached as ``entries``: what HiGHS is
        handed. scipy's sparse module costs about 0.4 s to import, more than a
        1,000-job round's LP; the arrays equal ``matrix().tocsc()``'s."""
        key = self._rows_key()
        got = self._arrays.get("columns")
        if got is not None and got[0] == key:
            return got[1]
        lens, cols, data = self.entries()
        rows = np.repeat(np.arange(len(self.rows), dtype=np.int64), lens)
        order = np.lexsort((rows, cols))  # by column, then row
        indptr = np.zeros(self.num_vars + 1, np.int64)
        np.cumsum(np.bincount(cols, minlength=self.num_vars), out=indptr[1:])
        out = Columns(indptr, rows[order], data[order])
        for a in out:
            a.flags.writeable = False
        self._arrays["columns"] = (key, out)
        return out

    def activity(self, x: np.ndarray) -> np.ndarray:
        """Each row's ``a.x`` (numpy only: checking an answer needs no sparse matrix)."""
        x = np.asarray(x, float)
        lens, cols, data = self.entries()
        rows = np.repeat(np.arange(len(self.rows)), lens)
        return np.bincount(rows, weights=data * x[cols], minlength=len(self.rows))

    def entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row lengths, column indices and coefficients, row by row (read-only arrays,
        cached until a row is added: see ``_arrays``): the rows in numpy, for a solver
        that reads them without building a sparse matrix."""
        key = self._rows_key()
        got = self._arrays.get("entries")
        if got is not None and got[0] == key:
            return got[1]
        lens = np.fromiter((len(r.coeffs) for r in self.rows), np.int64, len(self.rows))
        nnz = int(lens.sum())
        cols = np.fromiter(chain.from_iterable(r.coeffs for r in self.rows), np.int64, nnz)
        data = np.fromiter(chain.from_iterable(r.coeffs.values() for r in self.rows), float, nnz)
        for a in (lens, cols, data):
            a.flags.writeable = False
        # a copy of the model (copy.copy: LP rounding's relaxation) shares the rows and this
        # cache: both then hold the same rows, so the arrays stay true for both
        self._arrays["entries"] = (key, (lens, cols, data))
        return lens, cols, data

    def row_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Each row's lower and upper bound (read-only arrays, cached as ``entries``)."""
        key = self._rows_key()
        got = self._arrays.get("bounds")
        if got is not None and got[0] == key:
            return got[1]
        lb = np.fromiter((r.lb for r in self.rows), float, len(self.rows))
        ub = np.fromiter((r.ub for r in self.rows), float, len(self.rows))
        lb.flags.writeable = ub.flags.writeable = False
        self._arrays["bounds"] = (key, (lb, ub))
        return lb, ub

    def _rows_key(self) -> tuple[int, int, int | None]:
        """What adding a row changes (rows are never edited in place: see ``_arrays``)."""
        return (len(self.rows), id(self.rows), id(self.rows[-1]) if self.rows else None)

    def vector(self, name: str) -> np.ndarray:
        """``obj``, ``lb``, ``ub`` (floats) or ``integer`` (booleans) as a read-only array,
        cached until a variable is added (a round reads them for every answer it compares
        and checks: converting the lists each time was about 3 % of a replay). Variables
        are only appended, never edited in place (as rows: see ``_arrays``)."""
        values = getattr(self, name)
        got = self._arrays.get(name)
        # the list itself is kept with its array (not its id, which a freed list's
        # successor could reuse: a copy of the model shares this cache)
        if got is not None and got[0] is values and got[1] == len(values):
            return got[2]
        arr = np.asarray(values, bool if name == "integer" else float)
        arr.flags.writeable = False
        self._arrays[name] = (values, len(values), arr)
        return arr

    def objective_value(self, x: np.ndarray) -> float:
        return float(np.dot(self.vector("obj"), x) + self.obj_constant)

    def is_feasible(self, x: np.ndarray, tol: float = 1e-6) -> bool:
        """Check bounds, integrality and rows of ``x`` against this model."""
        return not self.violations(x, tol, limit=1)

    def violations(self, x: np.ndarray, tol: float = 1e-6, limit: int = 5) -> list[str]:
        """What ``x`` breaks of this model, by name (at most ``limit``): its length, a
        variable's bounds or integrality, a row. Empty when ``x`` is a solution: every
        answer a round may use is checked here, so a constraint a researcher added to the
        model always holds, whichever heuristic or backend answered."""
        x = np.asarray(x, float)
        if x.shape != (self.num_vars,):
            return [f"an answer of {x.size} values for {self.num_vars} variables"]
        out: list[str] = []
        lb, ub = self.vector("lb"), self.vector("ub")
        for i in np.flatnonzero((x < lb - tol) | (x > ub + tol))[:limit]:
            out.append(f"bounds of {self.var_keys[i]!r}: {x[i]:g} not in [{lb[i]:g}, {ub[i]:g}]")
        ints = self.vector("integer")
        for i in np.flatnonzero(ints & (np.abs(x - np.round(x)) > tol))[:limit - len(out)]:
            out.append(f"integrality of {self.var_keys[i]!r}: {x[i]:g}")
        if self.rows and len(out) < limit:
            act = self.activity(x)
            rlb, rub = self.row_bounds()
            for i in np.flatnonzero((act < rlb - tol) | (act > rub + tol))[:limit - len(out)]:
                r = self.rows[i]
                out.append(f"row {r.name or i}: {act[i]:g} not in [{r.lb:g}, {r.ub:g}]")
        return out

    def restricted(self, keep: np.ndarray) -> LinearModel:
        """This model over the columns ``keep`` (ascending indices) alone, the others taken
        at zero, every row kept (a row left empty still says whether zero satisfies it);
        the hint is this model's on those columns. A restricted MIP fixes most columns at
        zero: handed them, HiGHS spends most of its time presolving them away (4x on the
        replay's restricted MIPs). Raises ValueError if zero is outside a dropped column's
        bounds."""
        keep = np.asarray(keep, np.int64)
        dropped = np.ones(self.num_vars, bool)
        dropped[keep] = False
        lb, ub = self.vector("lb"), self.vector("ub")
        bad = np.flatnonzero(dropped & ((lb > 0.0) | (ub < 0.0)))
        if len(bad):
            raise ValueError(f"variable {self.var_keys[bad[0]]!r} cannot be taken at zero")
        new = np.full(self.num_vars, -1, np.int64)
        new[keep] = np.arange(len(keep))
        out = LinearModel(self.name, self.sense, obj_constant=self.obj_constant,
                          meta=dict(self.meta))
        out.add_vars(zip([self.var_keys[j] for j in keep], lb[keep].tolist(),
                         ub[keep].tolist(), self.vector("integer")[keep].tolist(),
                         self.vector("obj")[keep].tolist(), strict=True))
        lens, cols, data = self.entries()
        at = new[cols]
        mine = at >= 0
        # each row's kept entries, in order (most rows of a restricted MIP keep none)
        counts = np.bincount(np.repeat(np.arange(len(lens)), lens)[mine], minlength=len(lens))
        kept_cols, kept_data = at[mine].tolist(), data[mine].tolist()
        end = 0
        for r, n in zip(self.rows, counts.tolist(), strict=True):
            start, end = end, end + n
            out.rows.append(Row(r.name, dict(zip(kept_cols[start:end], kept_data[start:end]))
                                if n else {}, r.lb, r.ub))
        if self.hint:
            at = new[np.fromiter(self.hint, np.int64, len(self.hint))]
            values = np.fromiter(self.hint.values(), float, len(self.hint))
            out.hint = dict(zip(at[at >= 0].tolist(), values[at >= 0].tolist()))
        return out

    def is_pure_integer(self) -> bool:
        return all(self.integer)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sense": self.sense,
            "variables": self.num_vars,
            "integer_variables": int(sum(self.integer)),
            "rows": self.num_rows,
            "nonzeros": int(sum(len(r.coeffs) for r in self.rows)),
        }
