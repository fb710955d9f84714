"""`python -m tests.module_attributes`: every `module.name` the project's modules read
from a project module they import under a name of their own (`import a.b as m`,
`from a import b` where a.b is a module) exists there once both are imported.

A name moved out of a module and still read from it, inside a function no test
reaches, fails here rather than at a user's run (bench-structured read
servers.free_port for weeks after the helper moved). Prints one line per missing
name; exit status 1 when there is one.
"""

import ast
import importlib
import sys

from scripts.tools.import_cycles import ROOT, imported_from, module_files

# Loaded by file, before the package and MLX, as the install hook: never imported.
ALONE = ("scripts.tools.setup_fast_blas",)


def module_aliases(name: str, tree: ast.Module, modules: set[str]) -> dict[str, str]:
    """The local names `name` binds to project modules: {alias: module}."""
    package = name.rpartition(".")[0]
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = imported_from(package, node)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
    return aliases


def missing_names() -> list[str]:
    files = module_files()
    modules = {name for name in files if "-" not in name and name not in ALONE}
    missing = []
    for name in sorted(modules):
        path = files[name]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = module_aliases(name, tree, modules)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Load)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
            ):
                target = aliases[node.value.id]
                try:
                    module = importlib.import_module(target)
                except ImportError:
                    continue  # an optional client's module: the import test's matter
                if not hasattr(module, node.attr):
                    missing.append(
                        f"{path.relative_to(ROOT)}:{node.lineno}: "
                        f"{node.value.id}.{node.attr} ({target} has no {node.attr})"
                    )
    return missing


if __name__ == "__main__":
    found = missing_names()
    print("\n".join(found))
    sys.exit(1 if found else 0)
