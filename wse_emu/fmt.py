"""Numbers people can read and aligned plain-text tables: one formatting for the command line, the
reports and the figures."""

from __future__ import annotations


def si(value: float, unit: str = "", digits: int = 3) -> str:
    """1234567 -> '1.23 M'; keeps small numbers as they are."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {prefix}{unit}"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value)} {unit}".rstrip()
    return f"{value:.{digits}g} {unit}".rstrip()


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB"


def seconds(value: float) -> str:
    """0.0123 -> '12.3 ms'; a value that rounds up to the next unit takes it (0.9996 -> '1 s',
    never '1e+03 ms')."""
    if value >= 0.9995:
        return f"{value:.3g} s"
    if value >= 0.9995e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} us"


def table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """Columns padded to their widest cell; ``align`` has one 'l' or 'r' per column."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)
    lines = []
    for n, row in enumerate(cells):
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align)]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
