"""The one markdown table renderer of the project.

Every result table (the comparison harness, the reproductions, the benchmarks, Hydra's
figure 6, the fine-tuning comparison) is written through :func:`markdown_table`, so
they all escape cells, align columns and format numbers the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["format_number", "frame_markdown", "markdown_table"]


def format_number(v: Any) -> str:
    """Floats with four significant digits (whole numbers from 10^4 up); NaN and None empty."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    try:  # numpy scalars
        import numpy as np

        if isinstance(v, np.floating):
            return format_number(float(v))
        if isinstance(v, np.integer):
            return str(int(v))
    except ImportError:  # pragma: no cover
        pass
    return str(v)


def _cell(v: Any, fmt: Callable[[Any], str]) -> str:
    text = v if isinstance(v, str) else fmt(v)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[Any]],
                   align: Sequence[str] | None = None,
                   fmt: Callable[[Any], str] = format_number) -> str:
    """A GitHub-flavoured markdown table; ``align`` per column: ``"l"``, ``"r"`` or ``""``.

    Strings are kept as given (pre-formatted cells, bold markers); other values go
    through ``fmt``. Pipes inside cells are escaped. Ends with a newline.
    """
    marks = {"l": ":---", "r": "---:", "": "---"}
    align = list(align) if align is not None else [""] * len(columns)
    lines = ["| " + " | ".join(_cell(c, str) for c in columns) + " |",
             "|" + "|".join(marks[a] for a in align) + "|"]
    for r in rows:
        cells = [_cell(v, fmt) for v in r]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def frame_markdown(df: Any, fmt: Callable[[Any], str] = format_number) -> str:
    """A pandas DataFrame as a markdown table (its columns, its rows in order)."""
    cols = [str(c) for c in df.columns]
    return markdown_table(cols, (list(r) for r in df.itertuples(index=False, name=None)),
                          fmt=fmt)
