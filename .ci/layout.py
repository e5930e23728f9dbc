#!/usr/bin/env python3
"""Checks the layout of kodx's crates (run by .ci/run before the tests):
- no import cycle between the files of a crate (`src/` and every `crates/*/src/`);
- no glob import (`use x::*`) in production code;
- no import from a lower floor up into serve/ (only serve/ itself and main.rs use it);
- no production file over 800 lines and no function over 150.

The graph is the one a reader reads. A file's production code is the whole file minus its
`#[cfg(test)] mod tests { … }` block; a file that is only declared under `#[cfg(test)]` (a
test helper module) is skipped whole. Comments and string literals are blanked first. Every
path is read, not only `use` lines: `crate::a::b`, `self::…`, `super::…`, a path through a
child module (`names::cut`) and a path through a name a `use` line brought in (`texts::status`).
A path counts as an edge to the deepest file it names: `crate::serve::worker::EngineStatus`
is an edge to `serve/worker/mod.rs`, whatever that file re-exports. A `pub use` is an import
of the file that writes it, except where a module's face re-exports its own files' items
(`pub use intake::Intake;` in `db/mod.rs`): that is part of declaring them, as `mod intake;`
is. So `db/intake.rs` naming `super::Db` while `db/mod.rs` calls `intake::…` is a cycle; a
child naming a sibling through the face (`super::Intake`) is an edge to the face only.

`python3 .ci/layout.py [ROOT] [graph]`: ROOT defaults to the repository holding this script;
`graph` also prints every file's edges. Exits non-zero and names each problem."""
import os, re, sys

MAX_FILE, MAX_FN = 800, 150


def blank(text):
    """The text with comments removed and string/char literal contents blanked, same lines."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        out.append("\n")
                    i += 1
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + m.group(1), m.end())
            end = n if end < 0 else end
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end + 1 + len(m.group(1))
        elif c == '"' or (c == "b" and text.startswith('b"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_"))):
            i += 2 if c == "b" else 1
            nl = 0
            while i < n and text[i] != '"':
                if text[i] == "\\":
                    i += 1
                if i < n and text[i] == "\n":
                    nl += 1
                i += 1
            out.append('""' + "\n" * nl)
            i += 1
        elif c == "'":
            m = re.compile(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'").match(text, i)
            if m:
                out.append("' '")
                i = m.end()
            else:  # a lifetime or a label
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


TESTS = re.compile(r"^[ \t]*#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+tests\s*\{", re.M)


def without_tests(text):
    """The text without its `#[cfg(test)] mod tests { … }` block(s), read on blanked code."""
    code = blank(text)
    assert code.count("\n") == text.count("\n"), "blanking must keep lines"
    keep_code, keep_text = code.splitlines(keepends=True), text.splitlines(keepends=True)
    while True:
        m = TESTS.search(code)
        if not m:
            return code, "".join(keep_text)
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        a, b = code.count("\n", 0, m.start()), code.count("\n", 0, j) + 1
        del keep_code[a:b], keep_text[a:b]
        code = "".join(keep_code)


def split_top(s):
    depth, cur, items = 0, "", []
    for ch in s:
        depth += {"{": 1, "}": -1}.get(ch, 0)
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


USE = re.compile(r"(?<![\w$])(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
PATH = re.compile(r"(?<![\w:$])(?<!\bin )([A-Za-z_]\w*)((?:\s*::\s*\w+)+)")
KEYWORDS = {"crate", "self", "super"}


class Crate:
    def __init__(self, src, label):
        self.src, self.label = src, label
        self.files = {}
        for root, _, names in os.walk(src):
            for n in names:
                if n.endswith(".rs"):
                    rel = os.path.relpath(os.path.join(root, n), src)
                    if rel != "main.rs":
                        parts = rel[:-3].split("/")
                        if parts[-1] in ("mod", "lib"):
                            parts = parts[:-1]
                        self.files[tuple(parts)] = rel
        raw = {m: open(os.path.join(src, rel), encoding="utf-8").read() for m, rel in self.files.items()}
        test_only = set()
        for mod, text in raw.items():
            for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", blank(text)):
                test_only.add(mod + (m.group(1),))
        for mod in list(self.files):
            if any(mod[: k] in test_only for k in range(1, len(mod) + 1)):
                del self.files[mod]
        self.code, self.prod = {}, {}
        for mod in self.files:
            self.code[mod], self.prod[mod] = without_tests(raw[mod])

    def path(self, rel):
        return os.path.join(self.label, rel)

    def absolute(self, mod, path, aliases):
        """The crate-absolute module path a path names, or None (std, another crate)."""
        if not path:
            return None
        head = path[0]
        if head == "crate":
            return list(path[1:])
        if head == "self":
            return list(mod) + list(path[1:])
        if head == "super":
            cur, q = list(mod), list(path)
            while q and q[0] == "super":
                cur, q = cur[:-1], q[1:]
            return cur + q
        if tuple(mod) + (head,) in self.files:
            return list(mod) + list(path)
        if head in aliases:
            return aliases[head] + list(path[1:])
        return None

    def below(self, mod, path):
        """Whether a path names an item of a file under `mod` (its child or deeper)."""
        if path is None or len(path) <= len(mod) or tuple(path[: len(mod)]) != tuple(mod):
            return False
        return self.file_of(path) != mod

    def file_of(self, path):
        for k in range(len(path), -1, -1):
            if tuple(path[:k]) in self.files:
                return tuple(path[:k])
        return None

    def read(self, mod):
        """(edges, glob imports) of one file's production code."""
        code = self.code[mod]
        uses, globs = [], []
        for m in USE.finditer(code):
            body = re.sub(r"\s+", " ", m.group(2)).strip()
            for path, alias in expand(body):
                if path and path[-1] == "*":
                    globs.append(code.count("\n", 0, m.start()) + 1)
                    path = path[:-1]
                uses.append((path, alias, bool(m.group(1))))
        aliases = {}
        for path, alias, _ in uses:
            a = self.absolute(mod, path, {})
            if a is not None and alias not in KEYWORDS:
                aliases[alias] = a
        targets = []
        for path, _, public in uses:
            target = self.absolute(mod, path, aliases)
            # A module's face re-exporting what its own files define is part of declaring
            # them, as `mod child;` is: no edge. Re-exporting anything else is an import.
            if not (public and self.below(mod, target)):
                targets.append(target)
        rest = USE.sub(" ", code)
        for m in PATH.finditer(rest):
            segs = [m.group(1)] + [s.strip() for s in m.group(2).split("::") if s.strip()]
            targets.append(self.absolute(mod, segs, aliases))
        deps = set()
        for t in targets:
            if t is not None:
                f = self.file_of(t)
                if f is not None and f != mod:
                    deps.add(f)
        return deps, globs


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
        for w in sorted(edges.get(v, ())):
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
                sccs.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return sccs


def shortest_loop(comp, edges):
    """One shortest cycle through the component's first file, as a reader would follow it."""
    start, inside = comp[0], set(comp)
    prev, queue = {start: None}, [start]
    for v in queue:
        for w in sorted(edges[v] & inside):
            if w == start:
                loop = [v]
                while prev[loop[-1]] is not None:
                    loop.append(prev[loop[-1]])
                return [start] + loop[::-1][1:] + [start] if len(loop) > 1 else [start, v, start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def check(crate, serve_floor, problems, graph):
    f = crate.files
    edges = {}
    for mod in sorted(f):
        deps, globs = crate.read(mod)
        edges[mod] = deps
        for line in sorted(set(globs)):
            problems.append(f"{crate.path(f[mod])}:{line}: glob import in production code (name what it imports)")
        n = crate.prod[mod].count("\n")
        if n > MAX_FILE:
            problems.append(f"{crate.path(f[mod])}: {n} lines of production code (at most {MAX_FILE})")
        for line, name, n in long_functions(crate.prod[mod]):
            problems.append(f"{crate.path(f[mod])}: fn {name} (near line {line}) has {n} lines (at most {MAX_FN})")
    if serve_floor:
        for mod, deps in sorted(edges.items()):
            if mod[:1] != ("serve",) and mod != ():
                for d in sorted(deps):
                    if d[:1] == ("serve",):
                        problems.append(f"{crate.path(f[mod])} imports {crate.path(f[d])}: a lower floor reaches up into serve/")
    for comp in cycles(edges):
        loop = shortest_loop(comp, edges)
        problems.append(
            f"import cycle among {len(comp)} files: " + " → ".join(crate.path(f[c]) for c in loop)
            + ("" if len(comp) == len(loop) - 1 else f" (and {', '.join(crate.path(f[c]) for c in comp if c not in loop)})")
        )
    if graph:
        for m, d in sorted(edges.items()):
            print(crate.path(f[m]), "->", " ".join(sorted(crate.path(f[x]) for x in d)))
    return len(f)


def main():
    args = sys.argv[1:]
    graph = "graph" in args
    args = [a for a in args if a != "graph"]
    root = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    crates = [("src", True)]
    members = os.path.join(root, "crates")
    if os.path.isdir(members):
        crates += [(os.path.join("crates", c, "src"), False) for c in sorted(os.listdir(members)) if os.path.isdir(os.path.join(members, c, "src"))]
    problems, files = [], 0
    for rel, serve_floor in crates:
        files += check(Crate(os.path.join(root, rel), rel), serve_floor, problems, graph)
    for p in problems:
        print(p)
    if problems:
        print(f"layout: {len(problems)} problem(s) in {files} files of {len(crates)} crate(s)", file=sys.stderr)
        sys.exit(1)
    print(f"layout: {files} files in {len(crates)} crate(s): no import cycle, no glob import, no upward import into serve/, no file over {MAX_FILE} lines, no function over {MAX_FN}")


if __name__ == "__main__":
    main()
