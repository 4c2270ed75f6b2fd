"""The webapp modules import each other without a cycle (counting imports inside functions too),
so each can be imported and read on its own."""
import ast
from pathlib import Path

WEBAPP = Path(__file__).resolve().parents[1] / "webapp"


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("webapp."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("webapp."))
    return found


def test_no_import_cycle_in_webapp():
    graph = {p.stem: imports_of(p) for p in WEBAPP.glob("*.py") if p.stem != "__init__"}
    assert graph["routes"] and "app" not in graph["routes"]
    done, path = set(), []

    def visit(module):
        if module in path:
            cycle = path[path.index(module):] + [module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        path.append(module)
        for dep in sorted(graph.get(module, ())):
            visit(dep)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
