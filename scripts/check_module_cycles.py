"""Import circles between the modules of each crate.

Usage: python3 scripts/check_module_cycles.py   (from the repository root; exit status 1 when
a crate's modules import each other in a circle)

Reads every `crates/*/src/**/*.rs`, takes each `crate::a::b` and `super::a` path outside
comments and unit tests as an edge from the file's module to the deepest module the path
names, and prints each crate's strongly connected groups of two or more modules. A module's
own submodules and its ancestors are not edges (a parent declares its children).
Approximate by design: names re-exported at a crate's root (`crate::Result`) count as
the root, not as the module that defines them.
"""
import os
import re
import sys
from collections import defaultdict


def module_of(src_root, path):
    parts = os.path.relpath(path, src_root)[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts)


def code_of(path):
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"#\[cfg\(test\)\]\s*mod tests \{.*", "", text, flags=re.S)
    return re.sub(r"//.*", "", text)


def edges(src_root):
    files = {}
    for d, _, names in os.walk(src_root):
        for n in names:
            if n.endswith(".rs"):
                p = os.path.join(d, n)
                files[module_of(src_root, p)] = p
    graph = defaultdict(set)
    for m, p in files.items():
        code = code_of(p)
        base = m.split("::")[:-1] if m else []
        paths = [ref.split("::") for ref in re.findall(r"crate::((?:\w+::)*\w+)", code)]
        paths += [base + ref.split("::") for ref in re.findall(r"super::((?:\w+::)*\w+)", code)]
        for parts in paths:
            for k in range(len(parts), 0, -1):
                target = "::".join(parts[:k])
                if target in files:
                    if target and target != m and not m.startswith(target + "::") \
                            and not target.startswith(m + "::" if m else "\0"):
                        graph[m].add(target)
                    break
    return files, graph


def circles(nodes, graph):
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def main():
    bad = False
    for crate in sorted(os.listdir("crates")):
        src = os.path.join("crates", crate, "src")
        if not os.path.isdir(src):
            continue
        files, graph = edges(src)
        found = circles(files, graph)
        print(f"{crate}: {len(files)} modules, " + (
            "no import circles" if not found else "import circles: " + "; ".join(
                " <-> ".join(g) for g in found)))
        bad |= bool(found)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
