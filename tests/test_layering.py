"""The house drawn from imports: the core of wse_emu depends on neither the compiler nor the
figures (only the command line wires them together), and the compiler draws nothing."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def package_of(module: str) -> str:
    """The package a module belongs to: its top-level name, or for ours, its folder
    (``wse_emu.compiler``, ``wse_emu.visualize``, ...; the core is ``wse_emu``)."""
    parts = module.split(".")
    if parts[0] == "wse_emu" and len(parts) > 1 and parts[1] in FOLDERS:
        return f"wse_emu.{parts[1]}"
    return parts[0]


FOLDERS = ("compiler", "visualize", "programs")  # installed under wse_emu, kept beside it


def imported(path: Path) -> set[str]:
    """Packages a module imports, wherever in the module the import stands."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(package_of(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(package_of(node.module))
    return names


def modules(package: str, skip: tuple = ()) -> list[Path]:
    return [p for p in sorted((ROOT / package).rglob("*.py"))
            if not set(skip) & set(p.relative_to(ROOT).parts)]


# The command line and the Python API wire the packages together; nothing else in wse_emu may.
@pytest.mark.parametrize("package,skip,forbidden", [
    ("wse_emu", ("cli", "api.py"), {"wse_emu.compiler", "wse_emu.visualize"}),
    ("compiler", (), {"wse_emu.visualize"}),
])
def test_no_import_points_back_up(package, skip, forbidden):
    offenders = {str(p.relative_to(ROOT)): sorted(imported(p) & forbidden)
                 for p in modules(package, skip) if imported(p) & forbidden}
    assert not offenders


def test_the_check_sees_an_offending_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from wse_emu.compiler.mapper import compile_model\n")
    assert "wse_emu.compiler" in imported(bad)


@pytest.mark.slow
def test_nothing_installs_a_generic_top_level_name():
    """The compiler, the figures and the presets keep their folders but are installed as
    ``wse_emu.compiler``, ``wse_emu.visualize`` and ``wse_emu.programs``: a user's own
    ``compiler`` or ``programs`` package never collides with ours."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert all(p == "wse_emu" or p.startswith("wse_emu.") for p in config["packages"])
    assert config["package-dir"] == {f"wse_emu.{f}": f for f in FOLDERS}
    for path in [*ROOT.glob("*/**/*.py")]:
        if ".git" in path.parts or "build" in path.parts:
            continue
        generic = {n for n in imported(path) if n in FOLDERS}
        assert not generic, f"{path.relative_to(ROOT)} imports {generic} by a generic name"


def test_every_package_folder_is_installed():
    """setuptools installs only the packages it is told of; a folder left out imports from a
    checkout (the editable install) but not from a built wheel."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    where = {folder: name for name, folder in config["package-dir"].items()}
    found = set()
    for init in [*ROOT.glob("wse_emu/**/__init__.py"), *(p for f in FOLDERS
                                                      for p in ROOT.glob(f"{f}/**/__init__.py"))]:
        parts = init.parent.relative_to(ROOT).parts
        top = where.get(parts[0], parts[0])
        found.add(".".join([top, *parts[1:]]))
    assert found == set(config["packages"])


@pytest.mark.slow
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


def test_the_compile_options_a_program_keeps_live_in_the_core():
    """The program format keeps its CompileOptions, so they are defined in the core; the
    compiler's users import the same class from ``wse_emu.compiler.options``."""
    from wse_emu.compile_options import CompileOptions
    from wse_emu.compiler.options import CompileOptions as compilers

    assert compilers is CompileOptions and CompileOptions.__module__ == "wse_emu.compile_options"
