"""Import cycles among the project's own modules: `python -m scripts.tools.import_cycles`.

Reads every module's imports with ast (those inside functions and under
TYPE_CHECKING too: a type-only cycle is still two modules that need each other),
keeps those of the project's modules (src/*, scripts/, the root scripts), and
prints each group of modules that import each other in a circle, with one circle
through it. Exit status 1 when there is one.
"""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_files() -> dict[str, Path]:
    """Every project module's dotted name -> its file (a package: its __init__)."""
    files = {}
    roots = [(ROOT / "src", path) for path in (ROOT / "src").glob("*/**/*.py")]
    roots += [(ROOT, path) for path in (ROOT / "scripts").glob("**/*.py")]
    roots += [(ROOT, path) for path in ROOT.glob("*.py")]
    for base, path in roots:
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def imported_from(package: str, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` reads from, inside `package`."""
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return base


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The project modules `name` imports: `import a.b` -> a.b; `from a import b`
    -> a.b when it is a module, else a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(package, node)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in modules else base)
    return {module for module in found if module in modules and module != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                group.append(other)
                if other == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def circle(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """One path from the group's first module back to itself, within the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for other in sorted(graph[node] & members):
            if other == start:
                return paths[node] + [start]
            if other not in paths:
                paths[other] = paths[node] + [other]
                queue.append(other)
    return group


def main() -> None:
    files = module_files()
    graph = {name: imports_of(name, path, set(files)) for name, path in files.items()}
    groups = cycles(graph)
    for group in groups:
        print(" -> ".join(circle(graph, group)))
    print(f"{len(files)} modules, {len(groups)} import cycles")
    sys.exit(1 if groups else 0)


if __name__ == "__main__":
    main()
