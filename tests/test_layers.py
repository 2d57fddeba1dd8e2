"""The package layering of DESIGN.md ("Layout"): the core imports only downward
(specs <- perf <- serve <- plan), never the packages outside it; fit, validate, the front ends
and the benchmarks may import the core; no module imports itself back through a cycle; each
package says in its README what it holds and what it may import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from model import ROOT

PACKAGE = ROOT / "model"
CORE = ("specs", "perf", "serve", "plan")
# what each package may import besides itself (DESIGN.md, "Layout")
ALLOWED = {
    "specs": set(),
    "perf": {"specs"},
    "serve": {"specs", "perf"},
    "plan": {"specs", "perf", "serve"},
    "fit": set(CORE),
    "validate": set(CORE) | {"fit"},
    "frontends": set(CORE) | {"fit", "validate"},
    "bench": set(CORE) | {"fit", "validate", "frontends"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str) -> set[str]:
    """Modules of `model` that `name` imports anywhere in its body (inside functions too)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in MODULES and t != name}
    return out


GRAPH = {name: _imports(name) for name in MODULES}


def _layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_module_sits_in_a_layer():
    loose = sorted(n for n in MODULES if n != "model" and _layer(n) not in ALLOWED)
    assert loose == [], f"modules outside the layer packages: {loose}"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_what_it_may(layer):
    wrong = sorted(f"{name} -> {dep}" for name, deps in GRAPH.items() if _layer(name) == layer
                   for dep in deps
                   if _layer(dep) not in ALLOWED[layer] | {layer, None})
    assert wrong == [], f"{layer} may import only {sorted(ALLOWED[layer])}: {wrong}"


def test_no_import_cycles():
    """Tarjan's strongly connected components over the module graph: every one is a single
    module."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == []


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_package_has_a_readme(layer):
    readme = PACKAGE / layer / "README.md"
    assert readme.exists(), f"model/{layer}/README.md is missing"
    text = readme.read_text()
    assert "import" in text.lower(), f"model/{layer}/README.md does not say what it may import"


def test_cited_research_notes_are_in_the_repository():
    """Code, tests and data cite the research notes by their path inside the repository
    (papers/research/), so every citation resolves in a clone."""
    import re
    cited = set()
    for folder in ("model", "tests", "data", "hardware", "notebooks", "papers/vllm-agentx"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in {".py", ".yaml", ".md", ".ipynb"}:
                cited |= set(re.findall(r"papers/research/([\w-]+\.(?:md|csv))",
                                        path.read_text(errors="replace")))
    assert {"theory.md", "workloads.md", "hardware.md", "architectures.md"} <= cited
    assert all((ROOT / "papers" / "research" / name).is_file() for name in cited), cited


# The house's size rules (issue #34, "Pure functions over frozen specs"): modules of at most 600
# lines, no function over 120.
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 120


def test_modules_and_functions_stay_within_the_size_rules():
    long_modules, long_functions = [], []
    for name, path in sorted(MODULES.items()):
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}.{node.name}: {lines} lines")
    assert long_modules == [] and long_functions == [], long_modules + long_functions
