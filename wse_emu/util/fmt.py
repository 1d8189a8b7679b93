"""Numbers people can read and aligned plain-text tables: one formatting for the command line, the
reports and the figures."""

from __future__ import annotations


def si(value: float, unit: str = "", digits: int = 3) -> str:
    """1234567 -> '1.23 M'; keeps small numbers as they are. A value that rounds up to the
    next prefix takes it (999.5 -> '1 k', 999,999 -> '1 M'; never '1e+03' or '1e+03 k')."""
    text = _si(value, unit, digits)
    if "e+" in text:  # 1000 of a prefix once rounded: written with the next one
        rounded = float(f"{value:.{digits}g}")
        if rounded != value:
            return _si(rounded, unit, digits)
    return text


def _si(value: float, unit: str, digits: int) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {prefix}{unit}"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value)} {unit}".rstrip()
    return f"{value:.{digits}g} {unit}".rstrip()


def count(value: float) -> str:
    """A count of things as people write a model's size: 8.03 B, 494 M, 107 k, 512 (billions
    as B, not G: '0.000107 B parameters' tells a small model's size to nobody)."""
    for factor, prefix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor * 0.9995:
            return f"{value / factor:.3g} {prefix}"
    return f"{value:.3g}"


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


WIDTH = 100  # columns every printed table fits in: a terminal's, without wrapping


def number(value: float, digits: int = 3) -> str:
    """``si`` for a number of any size, never in exponent form: below 0.0001, where ``si``
    would write '1e-05', decimals ('0.00001'); beyond the largest prefix, the value rounded
    first."""
    if value == 0 or abs(value) >= 1e-4:
        text = si(value, digits=digits)
        return si(float(f"{value:.{digits}g}"), digits=digits) if "e" in text else text
    text = f"{value:.{digits}g}"
    if "e" not in text:
        return text
    exponent = int(text.split("e")[1])
    return f"{value:.{digits - 1 - exponent}f}".rstrip("0").rstrip(".")


def with_unit(value: float, unit: str) -> str:
    """A number as ``number`` writes it, then a unit written as a word: '8.48 k tok/s',
    '512 requests/s' (``si(value, 'B')`` joins a prefix to a symbol instead: '1.2 GB')."""
    return f"{number(value)} {unit}"


def duration(value: float) -> str:
    """``seconds`` for any time, as an axis counts it: '0 s', '-5 ms', '1,250 s', '40 ns'
    (``seconds`` takes positive times from 1 us to 1000 s)."""
    if value == 0:
        return "0 s"
    if value < 0:
        return "-" + duration(-value)
    if value < 0.9995e-6:
        return f"{number(value * 1e9)} ns"
    return seconds(value) if value < 999.5 else f"{value:,.0f} s"


def narrow_table(headers: list[str], rows: list[list], align: str | None = None,
                 width: int = WIDTH) -> str:
    """``table``, made to fit ``width`` columns: the widest columns' headers and cells are
    wrapped onto more lines (after a comma or before a parenthesis where there is one, else at a
    space) until the table fits; a table that fits already is exactly ``table``'s."""
    plain = table(headers, rows, align)
    if max(len(line) for line in plain.splitlines()) <= width:
        return plain
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = _fitted_widths(cells, width)
    align = align or "l" + "r" * (len(headers) - 1)
    lines = []
    for n, row in enumerate(cells):
        wrapped = [_wrap(c, w) for c, w in zip(row, widths)]
        for i in range(max(len(w) for w in wrapped)):
            parts = [(w[i] if i < len(w) else "") for w in wrapped]
            parts = [p.ljust(w) if a == "l" else p.rjust(w) for p, w, a in
                     zip(parts, widths, align)]
            lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fitted_widths(cells: list[list[str]], width: int) -> list[int]:
    """Column widths that fit ``width``: first headers wider than their column's cells are
    wrapped (that costs no row a line), then the widest column is narrowed a character at a
    time; none narrower than its longest word."""
    columns = list(zip(*cells))
    widths = [max(len(c) for c in col) for col in columns]
    body = [max((len(c) for c in col[1:]), default=0) for col in columns]
    floors = [max([len(word) for c in col for word in c.split()] or [1]) for col in columns]

    def too_wide() -> bool:
        return sum(widths) + 2 * (len(widths) - 1) > width

    for pick in (lambda i: widths[i] - max(body[i], floors[i]), lambda i: widths[i] - floors[i]):
        while too_wide():
            room = [i for i in range(len(widths)) if pick(i) > 0]
            if not room:
                break
            widest = max(room, key=lambda i: widths[i])
            widths[widest] -= 1
    return widths


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken after a comma or before a
    parenthesis first ('1 copy, tile 64,' / 'batch 64'; '16.4 k' / '(2.02 k to 26.2 k)'), then
    at spaces; a word longer than ``width`` keeps its line."""
    if len(text) <= width:
        return [text]
    lines: list[str] = []
    for piece in _pieces(text, width):
        if lines and len(lines[-1]) + 1 + len(piece) <= width:
            lines[-1] += " " + piece
        else:
            lines.append(piece)
    return lines


def _pieces(text: str, width: int) -> list[str]:
    """Runs of ``text`` that end at a comma or before a parenthesis, each split at its spaces
    if wider than ``width``."""
    out = []
    for run in text.replace(", ", ",\0").replace(" (", "\0(").split("\0"):
        if len(run) <= width:
            out.append(run)
        else:
            out += run.split()
    return out
