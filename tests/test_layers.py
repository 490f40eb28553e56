"""The package's modules import in one direction (docs/RUNTIME.md, "Layers"): the import graph of fnx, counting
imports inside functions and importlib calls with a constant name, has no cycle. An import that closes a cycle must
be listed in ALLOWED with the reason it cannot go; the list is empty, and the test also fails for a listed import
that no longer exists (so the list cannot go stale)."""
import ast
import pathlib

import fnx

ROOT = pathlib.Path(fnx.__file__).parent

# (importer, imported): why this import stays although it closes a cycle
ALLOWED: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _resolve(name: str, modules) -> str | None:
    while name and name not in modules: name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """{module: the fnx modules it imports anywhere in its text, except under `if TYPE_CHECKING:`}; `from fnx
    import x` counts as importing fnx.x when that is a module (importing a package's submodule is not importing
    the package's namespace)."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and ast.unparse(block.test)
                       in ("TYPE_CHECKING", "typing.TYPE_CHECKING") for n in ast.walk(block)}
        for node in ast.walk(tree):
            if id(node) in typing_only: continue  # annotations only: nothing is imported when the code runs
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package upwards
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base
                                                                                                     else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) ==
                  "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
                names = [node.args[0].value]
            for name in names:
                target = _resolve(name, modules) if name.split(".")[0] == "fnx" else None
                if target and target != module and not (module == "fnx" and target.startswith("fnx.")):
                    graph[module].add(target)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (as a list of modules, first repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1: return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)): return found
        stack.pop()
        state[m] = 2
        return None
    for m in sorted(graph):
        if m not in state and (found := visit(m)): return found
    return None


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    for (a, b) in ALLOWED: graph[a].discard(b)
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_allowed_imports_still_exist():
    graph = import_graph()
    stale = [pair for pair in ALLOWED if pair[1] not in graph.get(pair[0], ())]
    assert not stale, f"ALLOWED lists imports that are gone: {stale}"


def test_the_checker_finds_cycles():
    """The checker itself: a cycle through an import inside a function is found."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    graph = import_graph()
    assert "fnx.uop" in graph["fnx.trace"] and "fnx.trace" not in graph["fnx.uop"]


def test_the_lowering_does_not_import_backends():
    """lower/ reads a Target and gets device timing passed in: it never imports a backend (only the runtime
    interface's data types may be below it)."""
    graph = import_graph()
    concrete = {m for m in graph if m.startswith("fnx.backends.") and m != "fnx.backends.device"}
    for module, imports in graph.items():
        if module.startswith("fnx.lower"):
            assert not imports & concrete, f"{module} imports {imports & concrete}"
