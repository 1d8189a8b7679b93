"""The floor plan's rules that a reader relies on and an edit could quietly break: the Python
face stays thin, every dataclass is written out (no ``make_dataclass``: an editor and a type
checker see every field), and no function takes more arguments than a reader can hold (ten
for a public function, twelve for a jitted one, whose arguments are grouped in records)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("wse_emu", "compiler", "visualize")
MOST_PUBLIC = 10
MOST_JITTED = 12



def sources() -> list[Path]:
    return sorted(p for f in FOLDERS for p in (ROOT / f).rglob("*.py")
                  if "__pycache__" not in p.parts)


def jitted(node: ast.FunctionDef) -> bool:
    """Compiled by Numba: decorated with ``njit`` (called or not), ``jit`` or ``intrinsic``."""
    names = set()
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        names.add(target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", ""))
    return bool(names & {"njit", "jit", "intrinsic"})


def parameters(node: ast.FunctionDef) -> int:
    """The arguments a call names one by one (``*args`` and ``**options`` gather, and
    ``self``/``cls`` is the object's own)."""
    a = node.args
    count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
    return count - (1 if a.args and a.args[0].arg in ("self", "cls") else 0)


def too_many(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.FunctionDef):
            continue
        n = parameters(node)
        if jitted(node):
            n += bool(node.args.vararg) + bool(node.args.kwarg)
            if n > MOST_JITTED:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} (jitted, {n})")
        elif not node.name.startswith("_") and n > MOST_PUBLIC:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    return found


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_function_takes_more_arguments_than_a_reader_holds(path):
    assert too_many(path) == []


def test_the_count_sees_what_it_counts(tmp_path):
    code = tmp_path / "code.py"
    many = ", ".join(f"a{k}" for k in range(13))
    code.write_text(f"@njit(cache=True)\ndef hot({many}):\n    pass\n\n"
                    f"def public({many}, **options):\n    pass\n\n"
                    f"def _private({many}):\n    pass\n\n"
                    "class C:\n    def method(self, a, b, c, d, e, f, g, h, i, j):\n        pass\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert [f.split(" ", 1)[1] for f in too_many(code)] == ["hot (jitted, 13)",
                                                                "public (13)"]
    finally:
        ROOT = saved


def test_no_dataclass_is_made_at_run_time():
    offenders = [str(p.relative_to(ROOT)) for p in sources()
                 if "make_dataclass" in p.read_text(encoding="utf-8")]
    assert offenders == []


def test_the_python_face_stays_thin():
    """``wse_emu/api.py`` holds one call per command into the packages below it."""
    assert len((ROOT / "wse_emu" / "api.py").read_text().splitlines()) < 300
