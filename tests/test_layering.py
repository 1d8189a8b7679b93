"""The house drawn from imports: the core of wse_emu depends on neither the compiler nor the
figures (only the command line wires them together), and the compiler draws nothing."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported(path: Path) -> set[str]:
    """Top-level packages a module imports, wherever in the module the import stands."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def modules(package: str, skip: tuple = ()) -> list[Path]:
    return [p for p in sorted((ROOT / package).rglob("*.py"))
            if not set(skip) & set(p.relative_to(ROOT).parts)]


# The command line and the Python API wire the packages together; nothing else in wse_emu may.
@pytest.mark.parametrize("package,skip,forbidden", [
    ("wse_emu", ("cli", "api.py"), {"compiler", "visualize"}),
    ("compiler", (), {"visualize"}),
])
def test_no_import_points_back_up(package, skip, forbidden):
    offenders = {str(p.relative_to(ROOT)): sorted(imported(p) & forbidden)
                 for p in modules(package, skip) if imported(p) & forbidden}
    assert not offenders


def test_the_check_sees_an_offending_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from compiler.mapper import compile_model\n")
    assert "compiler" in imported(bad)


def test_only_the_command_line_imports_the_command_line():
    """wse_emu/cli holds argument parsing and printing only: the library, the API and the
    figures never reach into it (what they share, formatting and run directories, lives in
    wse_emu.fmt and wse_emu.outputs)."""
    offenders = []
    for package in ("wse_emu", "compiler", "visualize"):
        for path in modules(package, ("cli",)):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                module = (node.module if isinstance(node, ast.ImportFrom) else None) or ""
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if any(n.startswith("wse_emu.cli") for n in [module, *names]):
                    offenders.append(str(path.relative_to(ROOT)))
    assert not offenders
