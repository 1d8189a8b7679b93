"""One self-contained HTML page per run: the figures embedded (no files beside it needed), the
run's configuration and its key numbers as tables. Opens offline in any browser."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from wse_emu.util.atomic import write_text
from wse_emu.util.fmt import number

STYLE = """
body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
td, th { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f2f2f2; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.9em; color: #444; }
"""


def _table(rows: list[tuple[str, object]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"
                    for k, v in rows)
    return f"<table>{cells}</table>"


def _fmt(value) -> str:
    """A value as the command line writes it: counts with thousands separators, other numbers
    as ``fmt.number`` ('37.5 k', never '3.747e+04')."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return number(value)


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    mime = "image/svg+xml" if path.suffix == ".svg" else "image/png"
    return f'<img src="data:{mime};base64,{data}" alt="{html.escape(path.stem)}">'


def write_report(path: Path, title: str, config: list[tuple[str, object]],
                 metrics: list[tuple[str, object]], figures: list[tuple[Path, str]]) -> Path:
    """Write ``path``: ``figures`` are (image file, caption) pairs, embedded in order."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{STYLE}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
             "<h2>Configuration</h2>", _table(config)]
    if metrics:
        parts += ["<h2>Key numbers</h2>", _table(metrics)]
    parts.append("<h2>Figures</h2>")
    for figure, caption in figures:
        parts.append(f"<figure>{_image(figure)}<figcaption>{html.escape(caption)}"
                     "</figcaption></figure>")
    parts.append("</body></html>")
    write_text(path, "\n".join(parts))  # a report is there whole or not at all
    return path
