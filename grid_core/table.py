"""Plain-text tables for CLI output (no colour, stable column order)."""

from __future__ import annotations

from collections.abc import Sequence


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Render ``rows`` under ``headers`` as left-aligned columns separated by two spaces.

    Args:
        headers: column titles.
        rows: one sequence of cells per row; cells are shown with ``str()``.

    Returns:
        The table as one string without a trailing newline; ``(none)`` under the header row
        when there are no rows.
    """
    cells = [[str(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()
    out = [line, "  ".join("-" * w for w in widths)]
    out += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    if not cells:
        out.append("(none)")
    return "\n".join(out)
