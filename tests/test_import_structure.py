"""Imports run one way: no module of bertzoo imports one that (directly or not) imports it back. The layer rules are
in .importlinter, which CI checks with `lint-imports`."""

from __future__ import annotations

import grimp


def strongly_connected_components(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iteratively: the groups of modules that can all reach each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
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
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    return components


def test_no_module_imports_itself_back():
    graph = grimp.build_graph("bertzoo")
    modules = {m for m in graph.modules if m.startswith("bertzoo")}
    # Importing a subpackage runs its __init__: a package and its own modules are not a cycle.
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i in modules and not m.startswith(i + ".")}
             for m in modules}
    cycles = [sorted(c) for c in strongly_connected_components(edges) if len(c) > 1]
    assert cycles == []


def test_the_cycle_finder_finds_a_cycle():
    assert [sorted(c) for c in strongly_connected_components({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
            if len(c) > 1] == [["a", "b", "c"]]


def test_the_core_contract_lists_every_core_module():
    """.importlinter's core contract names every top-level module of core/ but the CLI's commands, which dispatch to
    every package: a new core module is checked from its first commit."""
    import configparser
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    parser = configparser.ConfigParser()
    parser.read(root / ".importlinter")
    listed = set(parser["importlinter:contract:core"]["source_modules"].split())
    commands = {"__init__", "__main__", "cli", "cli_pretrain", "cli_serve", "cli_zoo"}
    modules = {f"bertzoo.{p.stem}" for p in (root / "core").glob("*.py") if p.stem not in commands}
    assert listed == modules
