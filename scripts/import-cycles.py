#!/usr/bin/env python3
"""Finds import cycles between the Rust files of the workspace: `scripts/import-cycles.py [DIR]`
(DIR: a checkout, by default this one).

Reads every `crates/*/src/**/*.rs` file, the paths it names (`use` trees and paths written in
the code, `crate::`, `super::` and `self::`; not comments, not `mod` declarations), resolves
each to the file of the deepest module it names, and reports every set of files that import
one another, directly or through others (the strongly connected components of that graph).
Prints `no import cycles` and exits 0, or lists them and exits 1.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent).resolve()


def module_of(src: pathlib.Path, path: pathlib.Path) -> tuple:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    # String literals may hold "::" (messages); drop them.
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def inline_modules_resolved(text: str) -> str:
    """Inside an inline module (`mod tests { .. }`), `super::` is the file's own module."""
    out, pos = [], 0
    for m in re.finditer(r"\bmod\s+\w+\s*\{", text):
        if m.start() < pos:
            continue
        depth, end = 0, len(text)
        for i in range(m.end() - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                end = i + 1
                break
        out.append(text[pos : m.end()])
        out.append(re.sub(r"\bsuper::", "self::", text[m.end() : end]))
        pos = end
    out.append(text[pos:])
    return "".join(out)


def use_paths(tree: str, prefix: list) -> list:
    """The paths of a `use` tree (`a::{b, c::{d, self}}` → a::b, a::c::d, a::c)."""
    tree = tree.strip()
    if not tree:
        return []
    if "{" not in tree:
        path = [p.strip() for p in re.split(r"::", tree.split(" as ")[0]) if p.strip()]
        if path and path[-1] == "self":
            path = path[:-1]
        return [prefix + path]
    head, _, rest = tree.partition("{")
    head_parts = [p for p in head.strip().rstrip(":").split("::") if p.strip()]
    inner = rest[: rest.rfind("}")]
    items, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(inner[start:i])
            start = i + 1
    items.append(inner[start:])
    out = []
    for item in items:
        out += use_paths(item, prefix + [p.strip() for p in head_parts])
    return out


def absolute(module: tuple, path: list) -> list:
    """`path` (as written in `module`) from the crate root, or None for another crate's."""
    if not path:
        return None
    if path[0] == "crate":
        return path[1:]
    if path[0] in ("super", "self"):
        base = list(module)
        while path and path[0] in ("super", "self"):
            if path[0] == "super":
                base = base[:-1]
            path = path[1:]
        return base + path
    return None


def main() -> int:
    graph = {}
    for src in sorted(ROOT.glob("crates/*/src")):
        files = {module_of(src, f): f for f in src.rglob("*.rs")}
        for module, f in files.items():
            text = inline_modules_resolved(strip_comments(f.read_text()))
            paths = []
            for tree in re.findall(r"\buse\s+([^;]+);", text):
                paths += use_paths(tree, [])
            paths += [p.split("::") for p in re.findall(r"\b(?:crate|super|self)(?:::\w+)+", text)]
            targets = set()
            for path in paths:
                full = absolute(module, [p for p in path if p])
                if full is None:
                    continue
                # The deepest module the path names that is a file of this crate.
                for n in range(len(full), -1, -1):
                    if tuple(full[:n]) in files:
                        targets.add(files[tuple(full[:n])])
                        break
            targets.discard(f)
            graph[f] = targets
    # Tarjan's strongly connected components.
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(component)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    if not cycles:
        print(f"no import cycles between the {len(graph)} Rust files of crates/*/src")
        return 0
    for c in cycles:
        names = sorted(str(f.relative_to(ROOT)) for f in c)
        print("import cycle: " + " <-> ".join(names))
        for f in sorted(c):
            inside = sorted(str(t.relative_to(ROOT)) for t in graph[f] if t in c)
            print(f"  {f.relative_to(ROOT)} imports {', '.join(inside)}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
