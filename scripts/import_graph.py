#!/usr/bin/env python
"""维护者用：画出 ``tformer_lib`` 内部的导入图（import graph），并数出结构上的问题。

只读源码（``ast``，不导入任何模块），打印：

* 模块数与包根目录下的模块数；
* 导入环（import cycle，强连通分量里不止一个模块）；
* 层数：把环缩成一点后，从不导入任何包内模块的底层数起的最长路径；
* 从下往上的导入：按 ``GROUPS`` 里声明的分组次序（模型部件在下，呈现与命令在上），下层组导入上层组的每一条；
* 导入别的模块的私有名字（``from .x import _y``）的每一处。

用法::

    python scripts/import_graph.py              # 打印摘要
    python scripts/import_graph.py --edges      # 另外列出每一条导入边
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tformer_lib"

#: 分组次序（下层在前）：一个模块所属的组由它的第一个匹配前缀决定；不匹配任何前缀的模块算作 "model"。
GROUPS = [
    ("model", ("specials", "_checks", "seed", "temperature", "unknown_tokens", "parts")),
    ("translation", ("translation", "data", "text", "training")),
    ("lm", ("lm",)),
    ("measurement", ("measurement",)),
    ("parallel", ("parallel",)),
    ("serving", ("serving",)),
    ("part4", ("scale", "inference", "quant", "kernels", "finetune")),  # 第四部分：建在推理服务与并行之上
    ("experiments", ("experiments",)),
    ("presentation", ("notebook", "plotting", "widgets", "exercises", "fonts")),
    ("commands", ("__main__", "commands")),
]


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def group_of(module: str) -> int:
    parts = module.split(".")[1:]
    for rank, (_, prefixes) in enumerate(GROUPS):
        for prefix in prefixes:
            if parts and (parts[0] == prefix or ".".join(parts).startswith(prefix + ".")):
                return rank
    return 0


def resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """把相对导入 ``from ..x import y`` 解析成绝对模块名。"""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def collect():
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        modules[module_name(path)] = path
    edges = defaultdict(set)  # 模块 → 它导入的包内模块
    private = []  # (导入者, 被导入模块, 名字)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = resolve(name, is_package, node)
                if not target.startswith("tformer_lib"):
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    dest = sub if sub in modules else target
                    if dest in modules and dest != name:
                        edges[name].add(dest)
                    if alias.name.startswith("_") and not alias.name.startswith("__") and sub not in modules:
                        private.append((name, target, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("tformer_lib") and alias.name in modules and alias.name != name:
                        edges[name].add(alias.name)
    return modules, edges, private


def strongly_connected(nodes, edges):
    """Tarjan 算法：返回强连通分量的列表。"""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
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
            out.append(component)

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="列出每一条导入边")
    args = parser.parse_args()
    modules, edges, private = collect()
    # 包的 __init__ 只是重新导出，不算结构：环和层都只看真正的模块
    plain = [m for m in modules if modules[m].name != "__init__.py"]
    plain_edges = {m: {d for d in edges.get(m, ()) if modules[d].name != "__init__.py"} for m in plain}
    components = strongly_connected(plain, plain_edges)
    cycles = [sorted(c) for c in components if len(c) > 1]
    comp_of = {m: i for i, c in enumerate(components) for m in c}
    depth = {}

    def layer(i):  # 缩点后的最长路径（Tarjan 的输出是逆拓扑序，递归即可）
        if i not in depth:
            below = {comp_of[d] for m in components[i] for d in plain_edges[m]} - {i}
            depth[i] = 1 + max((layer(j) for j in below), default=0)
        return depth[i]

    layers = max(layer(i) for i in range(len(components)))
    upward = sorted((m, d) for m in plain for d in plain_edges[m] if group_of(d) > group_of(m))
    root = [m for m in plain if m.count(".") == 1]
    print(f"模块：{len(plain)}（另有 {len(modules) - len(plain)} 个包的 __init__）；包根目录下的模块：{len(root)}")
    print(f"层数：{layers}；导入环：{len(cycles)}；从下往上的导入：{len(upward)}；导入别的模块的私有名字：{len(private)}")
    for c in cycles:
        print("  环：", " ↔ ".join(c))
    for m, d in upward:
        print(f"  向上：{m}（{GROUPS[group_of(m)][0]}）→ {d}（{GROUPS[group_of(d)][0]}）")
    for m, target, name in private:
        print(f"  私有：{m} 导入 {target}.{name}")
    if args.edges:
        for m in sorted(plain):
            for d in sorted(plain_edges[m]):
                print(f"{m} -> {d}")


if __name__ == "__main__":
    main()
