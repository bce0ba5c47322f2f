#!/usr/bin/env python3
"""The crate's layers, checked: every module of src/ may import only from its own layer or a
lower one, and no files import each other, directly or round a longer circle. Reads the same
imports as /work/shared/tools/import-circles.py — `crate::`, `super::` and `self::` paths (with
`use x::{a, b::{c}}` groups expanded), test modules left out — and prints every import that goes
up a layer, every file the table below does not place, and every import circle (the files of
each, and one way round it). Exit 1 when there is any.

The circle check is the project's own, so that a clone without ../shared/tools/ still runs it
(`__test__/layers.test.mjs` runs this script unconditionally).

Usage: scripts/check-layers.py [SRC_DIR]   (default: the src/ next to this script)

The table is the architecture, bottom to top; a module's layer is that of the longest prefix
of its path listed here (`config` places `config::kubernetes` too)."""
import os
import re
import sys

LAYERS = [
    # 1. Foundations: plain data, configuration, checks, and host helpers with no session
    #    knowledge (processes, their owners and environments, the adapter's scratch
    #    directories, its outbound connections and unix-socket servers).
    (1, ['error', 'domain', 'stats', 'spend', 'output', 'deps', 'params', 'config', 'schema',
         'agent_definition', 'bash_validator', 'logging', 'otel', 'https', 'server', 'scratch',
         'process', 'audit', 'disk', 'clock']),
    # 2. Git: checkouts, patches, views, the shared base and its copy-on-write layer.
    (2, ['git']),
    # 3. The model gateway: the relay between the CLI and the model API (routes, upstream,
    #    providers, outage holds, the fleet's pace, the budget's metering), wherever a session
    #    runs (the local sandbox, a pod). It imports foundations only; git is beside it, not
    #    below it, and the sandbox above starts it.
    (3, ['gateway']),
    # 4. The OS sandbox (bubblewrap, cgroups, overlay, egress proxy, telemetry forwarder).
    (4, ['sandbox']),
    # 5. Where a session runs: local or in a Kubernetes pod.
    (5, ['environment']),
    # 6. The Claude Code CLI and its protocol.
    (6, ['claude']),
    # 7. What a session is told (context) and what it said (transcript).
    (7, ['context', 'transcript']),
    # 8. A session from start to outcome.
    (8, ['lifecycle']),
    # 9. The adapter: the process-wide state sessions share.
    (9, ['adapter']),
    # 10. napi.
    (10, ['binding']),
]
NAMES = {1: 'foundations', 2: 'git', 3: 'gateway', 4: 'sandbox', 5: 'environment', 6: 'claude',
         7: 'context/transcript', 8: 'lifecycle', 9: 'adapter', 10: 'binding'}
PREFIX = {tuple(p.split('::')): n for n, ps in LAYERS for p in ps}

here = os.path.dirname(os.path.abspath(__file__))
src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, '..', 'src')

mods = {}  # module path -> file (relative to src)
for root, _, files in os.walk(src):
    for f in files:
        if f.endswith('.rs'):
            p = os.path.relpath(os.path.join(root, f), src)
            parts = tuple(p[:-3].split(os.sep))
            if parts[-1] in ('mod', 'lib', 'main'):
                parts = parts[:-1]
            mods[parts] = p


def strip_tests(text):
    """Drops `#[cfg(test)] mod x { ... }` blocks (brace matching), as import-circles.py does,
    and `#[cfg(all(test, ...))]` ones too (which import-circles.py reads as the file's own
    imports: a unix-only test module's `use super::super::x` made an edge to the wrong file)."""
    out, i = [], 0
    for m in re.finditer(r'#\[cfg\((?:test|all\(\s*test\s*,[^\]]*\))\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{', text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {'{': 1, '}': -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return ''.join(out)


def strip_comments_and_strings(text):
    text = re.sub(r'/\*.*?\*/', '', text, flags=re.S)
    text = re.sub(r'//[^\n]*', '', text)
    # raw strings first (they may hold quotes), then ordinary ones
    text = re.sub(r'r(#+)".*?"\1', '""', text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text, flags=re.S)
    return text


def layer_of(path):
    for n in range(len(path), 0, -1):
        if path[:n] in PREFIX:
            return PREFIX[path[:n]]
    return None


def resolve(path):
    """The module a path names: its longest prefix that is a file of src/."""
    while path:
        if path in mods:
            return path
        path = path[:-1]
    return None


def absolute(mod, segs):
    """`crate::`/`super::`/`self::` path segments -> a path from the crate root, or None.
    `self` in `a/b.rs` or `a/b/mod.rs` is `a::b`; each `super` goes one module up."""
    rest = list(segs)
    if rest and rest[0] == 'crate':
        base, rest = (), rest[1:]
    elif rest and rest[0] == 'self':
        base, rest = mod, rest[1:]
    elif rest and rest[0] == 'super':
        base = mod
        while rest and rest[0] == 'super':
            base, rest = base[:-1], rest[1:]
    else:
        return None
    while rest and rest[0] == 'self':
        rest = rest[1:]
    return base + tuple(rest)


def use_paths(tree, prefix=()):
    """The paths of a use tree (`a::{b, c::{d, e}}`, `a::b as c`, `a::*`)."""
    tree = tree.strip()
    m = re.match(r'^((?:[A-Za-z_][A-Za-z0-9_]*\s*::\s*)*)\{(.*)\}$', tree, flags=re.S)
    if m:
        pre = prefix + tuple(s.strip() for s in m.group(1).split('::') if s.strip())
        depth, start, items, body = 0, 0, [], m.group(2)
        for k, ch in enumerate(body):
            depth += {'{': 1, '}': -1}.get(ch, 0)
            if ch == ',' and depth == 0:
                items.append(body[start:k])
                start = k + 1
        items.append(body[start:])
        out = [pre] if pre else []
        for item in items:
            if item.strip():
                out += use_paths(item, pre)
        return out
    tree = re.sub(r'\s+as\s+\w+$', '', tree)
    segs = tuple(s.strip() for s in tree.split('::') if s.strip() and s.strip() != '*')
    return [prefix + segs]


imports = {}  # file -> {target file}
for mod, f in mods.items():
    with open(os.path.join(src, f), encoding='utf-8') as fh:
        text = strip_comments_and_strings(strip_tests(fh.read()))
    paths = []
    for m in re.finditer(r'\buse\s+([^;]*);', text):
        paths += use_paths(m.group(1))
    for m in re.finditer(r'\b(?:crate|super|self)(?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+', text):
        paths.append(tuple(s.strip() for s in m.group(0).split('::')))
    targets = set()
    for p in paths:
        a = absolute(mod, p)
        if a is None:
            continue
        t = resolve(a)
        if t is not None and t != mod and not (t == () and a == ()):
            targets.add(t)
    imports[mod] = targets

upward, unplaced = [], []
for mod in sorted(mods):
    if mod == ():
        continue  # lib.rs: the crate root declares the modules, it imports none
    own = layer_of(mod)
    if own is None:
        unplaced.append(mods[mod])
        continue
    for t in sorted(imports[mod]):
        if t == ():
            continue
        theirs = layer_of(t)
        if theirs is not None and theirs > own:
            upward.append(f'{mods[mod]} (layer {own}, {NAMES[own]}) imports {mods[t]} '
                          f'(layer {theirs}, {NAMES[theirs]})')



def circles(edges):
    """The strongly connected components of two or more files (Tarjan's, without recursion):
    each is a set of files every one of which imports, through the others, every other."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def way_round(comp, edges):
    """One shortest way from the circle's first file back to itself through its files
    (breadth first; a file never imports itself, so the way has two files at least)."""
    first, inside = comp[0], set(comp)
    came, queue = {first: None}, [first]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v] & inside):
            if w == first:
                way = [v]
                while came[way[-1]] is not None:
                    way.append(came[way[-1]])
                return way[::-1] + [first]
            if w not in came:
                came[w] = v
                queue.append(w)
    return comp  # not reached: the files of a component reach each other


found = circles(imports)

for u in upward:
    print('upward:', u)
for u in unplaced:
    print('not placed:', u)
for c in found:
    print(f'circle of {len(c)}: ' + ', '.join(mods[m] for m in c)
          + ' (' + ' -> '.join(mods[m] for m in way_round(c, imports)) + ')')
print(f'{len(upward)} upward import(s), {len(unplaced)} unplaced file(s) among {len(mods)} files')
print(f'{len(found)} import circle(s) among {len(mods)} files')
sys.exit(1 if upward or unplaced or found else 0)
