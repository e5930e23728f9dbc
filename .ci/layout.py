#!/usr/bin/env python3
"""Checks the crate's layout (run by .ci/run before the tests):
- no import cycle between the files of src/;
- no import from a lower floor up into serve/ (only serve/ itself and main.rs use it);
- no production file over 800 lines and no function over 150 (code before `#[cfg(test)]`).

The import graph is read from the text of each file's production code: every `crate::…` path
and every path of a `use` line (groups expanded, `self::`/`super::`/child-relative paths
resolved). A path is resolved to the file that defines the item it names, following
`pub use` re-exports, so a `mod.rs` that only re-exports its children adds no edge of its own.

`python3 .ci/layout.py graph` also prints every file's imports. Exits non-zero and names
each problem."""
import os, re, sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
MAX_FILE, MAX_FN = 800, 150
DEF = r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:(?:async|const|unsafe|extern\s+\"C\")\s+)*(?:fn|struct|enum|trait|type|const|static|mod|union|macro_rules!)\s+{}\b"


def modpath(rel):
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def production(text):
    m = re.search(r"^#\[cfg\(test\)\]", text, re.M)
    return text[: m.start()] if m else text


def strip_comments(code):
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.S)
    out = []
    for line in code.splitlines():
        i = line.find("//")
        if i >= 0 and line.count('"', 0, i) % 2 == 0:
            line = line[:i]
        out.append(line)
    return "\n".join(out)


def split_top(s):
    depth, cur, items = 0, "", []
    for ch in s:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    return [i.strip() for i in items if i.strip()]


def expand(body):
    """`a::{b, c::{d as e}}` → [(['a','b'], 'b'), (['a','c','d'], 'e')]."""
    body = body.strip()
    i = body.find("{")
    if i < 0:
        name, _, alias = body.partition(" as ")
        path = [s for s in name.strip().split("::") if s]
        return [(path, alias.strip() or (path[-1] if path else ""))]
    head = [s for s in body[:i].split("::") if s]
    out = []
    for it in split_top(body[i + 1 : body.rfind("}")]):
        if it == "self":
            out.append((head, head[-1]))
        else:
            out.extend((head + p, a) for p, a in expand(it))
    return out


class Crate:
    def __init__(self):
        self.files = {}
        for root, _, names in os.walk(SRC):
            for n in names:
                if n.endswith(".rs"):
                    rel = os.path.relpath(os.path.join(root, n), SRC)
                    if rel != "main.rs":
                        self.files[modpath(rel)] = rel
        self.code, self.uses, self.prod = {}, {}, {}
        for mod, rel in self.files.items():
            prod = production(open(os.path.join(SRC, rel), encoding="utf-8").read())
            self.prod[mod] = prod
            code = strip_comments(prod)
            self.code[mod] = code
            uses = []
            for m in re.finditer(r"(^|[;{}]\s*)(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", code, re.M):
                body = re.sub(r"\s+", " ", m.group(3)).strip()
                for path, alias in expand(body):
                    uses.append((self.absolute(mod, path), alias, bool(m.group(2))))
            self.uses[mod] = uses

    def absolute(self, mod, path):
        if not path:
            return None
        if path[0] == "crate":
            return list(path[1:])
        if path[0] == "self":
            return list(mod) + list(path[1:])
        if path[0] == "super":
            cur, q = list(mod), list(path)
            while q and q[0] == "super":
                cur, q = cur[:-1], q[1:]
            return cur + q
        if tuple(mod) + (path[0],) in self.files:
            return list(mod) + list(path)
        return None  # an external crate or std

    def resolve(self, path, seen=()):
        for k in range(len(path), -1, -1):
            m = tuple(path[:k])
            if m in self.files:
                break
        else:
            return None
        if k == len(path) or (m, path[k]) in seen:
            return m
        item = path[k]
        if re.search(DEF.format(re.escape(item)), self.code[m], re.M):
            return m
        for target, alias, public in self.uses[m]:
            if public and alias == item and target:
                r = self.resolve(target + list(path[k + 1 :]), seen + ((m, item),))
                if r is not None:
                    return r
        return m

    def edges(self):
        edges = {}
        for mod in self.files:
            deps = set()
            targets = [t for t, _, public in self.uses[mod] if t is not None and not public]
            targets += [m.group(1).split("::")[1:] for m in re.finditer(r"(?<![\w:])(?<!\bin )crate((?:::\w+)+)", self.code[mod])]
            for t in targets:
                r = self.resolve(t)
                if r is not None and r != mod:
                    deps.add(r)
            edges[mod] = deps
        return edges


def long_functions(prod):
    lines = prod.splitlines()
    for i, line in enumerate(lines):
        fm = re.match(r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?(?:(?:const|async|unsafe)\s+)*fn\s+(\w+)", line)
        if not fm:
            continue
        ind = fm.group(1)
        for j in range(i, len(lines)):
            if lines[j].rstrip().endswith(";") and j == i:
                break
            if j > i and lines[j].startswith(ind + "}"):
                if j - i + 1 > MAX_FN:
                    yield i + 1, fm.group(2), j - i + 1
                break


def cycles(edges):
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return sccs


def main():
    crate = Crate()
    edges = crate.edges()
    f = crate.files
    problems = []
    for mod, rel in sorted(f.items()):
        n = crate.prod[mod].count("\n")
        if n > MAX_FILE:
            problems.append(f"src/{rel}: {n} lines of production code (at most {MAX_FILE})")
        for line, name, n in long_functions(crate.prod[mod]):
            problems.append(f"src/{rel}:{line}: fn {name} has {n} lines (at most {MAX_FN})")
    for mod, deps in sorted(edges.items()):
        if mod[:1] != ("serve",) and mod != ():
            for d in sorted(deps):
                if d[:1] == ("serve",):
                    problems.append(f"src/{f[mod]} imports src/{f[d]}: a lower floor reaches up into serve/")
    for comp in cycles(edges):
        problems.append("import cycle between: " + ", ".join(sorted("src/" + f[c] for c in comp)))
    if sys.argv[1:] == ["graph"]:
        for m, d in sorted(edges.items()):
            print("src/" + f[m], "->", " ".join(sorted("src/" + f[x] for x in d)))
    for p in problems:
        print(p)
    if problems:
        print(f"layout: {len(problems)} problem(s)", file=sys.stderr)
        sys.exit(1)
    print("layout: no import cycle, no upward import into serve/, no file over 800 lines, no function over 150")


if __name__ == "__main__":
    main()
