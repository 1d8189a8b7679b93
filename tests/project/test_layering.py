"""The house drawn from imports: the folders of wse_emu stand in layers, each importing only
from the layers below it (or its own), and no module imports itself back through others."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Bottom to top. A module may import its own layer and the layers before it in this list.
# ``errors`` is the floor every layer stands on; the compiler, the figures and the presets keep
# their folders at the top of the checkout but are installed under wse_emu.
LAYERS = ("errors", "util", "models", "hardware", "program", "engines", "functional", "kernels",
          "sim", "compiler", "serving", "pools", "experiments", "sweeps", "validation", "rundir",
          "visualize",
          "programs", "api", "cli")
OUTSIDE = {"compiler": "compiler", "visualize": "visualize", "programs": "programs"}
TOP = "__init__"  # wse_emu/__init__.py reaches the API lazily, by name


def module_name(path: Path) -> str:
    """The dotted name ``path`` is installed as."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in OUTSIDE:
        parts = ["wse_emu", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer_of(module: str) -> str | None:
    """The layer a module of ours stands in (None for the package itself and for others)."""
    parts = module.split(".")
    if parts[0] != "wse_emu" or len(parts) == 1:
        return None
    return parts[1]


def sources() -> list[Path]:
    paths = [*ROOT.glob("wse_emu/**/*.py"),
             *(p for f in OUTSIDE for p in ROOT.glob(f"{f}/**/*.py"))]
    return sorted(p for p in paths if "__pycache__" not in p.parts)


def imports(path: Path, here: str | None = None) -> set[str]:
    """Modules of ours ``path`` (installed as ``here``) imports, wherever in it the import
    stands, except under ``if TYPE_CHECKING:`` (read by type checkers only, never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
               and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    here = here or module_name(path)
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this module's package
                base = here.split(".")
                base = base[:len(base) - node.level + (path.name == "__init__.py")]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)
    return {n for n in names if n.startswith("wse_emu")}


def graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (names that are not modules, such as a class
    imported from a module, are dropped)."""
    found = {module_name(p): imports(p) for p in sources()}
    return {m: {d for d in deps if d in found and d != m} for m, deps in found.items()}


def test_every_folder_has_a_layer():
    folders = {p.parent.relative_to(ROOT / "wse_emu").parts[0]
               for p in ROOT.glob("wse_emu/*/__init__.py")}
    modules = {p.stem for p in ROOT.glob("wse_emu/*.py")}
    assert folders | modules - {TOP} <= set(LAYERS), (folders | modules) - set(LAYERS)


def test_no_module_file_but_the_face_stands_in_wse_emu_itself():
    assert {p.name for p in ROOT.glob("wse_emu/*.py")} == {"__init__.py", "api.py", "errors.py"}


def test_each_layer_imports_only_from_below():
    rank = {name: k for k, name in enumerate(LAYERS)}
    offenders = []
    for module, deps in graph().items():
        here = layer_of(module)
        if here is None:
            continue
        for dep in deps:
            there = layer_of(dep)
            if there is not None and rank[there] > rank[here]:
                offenders.append(f"{module} imports {dep}")
    assert not offenders, "\n".join(sorted(offenders))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``edges``: each strongly connected group of two or more modules
    (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_import_circle():
    assert cycles(graph()) == []


def test_the_checks_see_what_they_look_for(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    bad = tmp_path / "bad.py"
    bad.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import wse_emu.api\n"
                   "def f():\n    from wse_emu.compiler.mapper import compile_model\n")
    assert imports(bad, "wse_emu.bad") == {"wse_emu.compiler.mapper",
                                          "wse_emu.compiler.mapper.compile_model"}


def test_only_the_command_line_imports_the_command_line():
    """wse_emu/cli holds argument parsing and printing only: nothing else reaches into it."""
    offenders = [m for m, deps in graph().items() if layer_of(m) != "cli"
                 and any(layer_of(d) == "cli" for d in deps)]
    assert not offenders


@pytest.mark.slow
def test_nothing_installs_a_generic_top_level_name():
    """The compiler, the figures and the presets keep their folders but are installed as
    ``wse_emu.compiler``, ``wse_emu.visualize`` and ``wse_emu.programs``: a user's own
    ``compiler`` or ``programs`` package never collides with ours."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert all(p == "wse_emu" or p.startswith("wse_emu.") for p in config["packages"])
    assert config["package-dir"] == {f"wse_emu.{f}": f for f in OUTSIDE}
    for path in [*ROOT.glob("*/**/*.py")]:
        if ".git" in path.parts or "build" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        generic = {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                   and not n.level and n.module and n.module.split(".")[0] in OUTSIDE}
        assert not generic, f"{path.relative_to(ROOT)} imports {generic} by a generic name"


def test_every_package_folder_is_installed():
    """setuptools installs only the packages it is told of; a folder left out imports from a
    checkout (the editable install) but not from a built wheel."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {module_name(p) for p in sources() if p.name == "__init__.py"}
    assert found == set(config["packages"])
