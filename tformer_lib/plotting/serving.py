"""第 13 章（推理服务）的图：批槽位时间线、分页缓存的块表、推测解码的接受率与加速比
（算术强度与屋顶线在 :mod:`tformer_lib.plotting.roofline`，这里也能导入）。

都是纯函数：给数据（配置、字典、BlockManager 或它的快照），返回 ``matplotlib.figure.Figure``，自己不计时。
算数据的代码在 :mod:`tformer_lib.serving`（``roofline``、``benchmark``、``paged_cache``、``speculative``）。
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np
from matplotlib.ticker import NullFormatter, ScalarFormatter

from tformer_lib.plotting._common import blank_figure, finite_array, finite_number, new_figure
from tformer_lib._checks import positive_int, positive_ints
from tformer_lib.plotting.roofline import plot_arithmetic_intensity, plot_roofline  # noqa: F401（第 13 章的图都能从这里导入）

__all__ = [
    "plot_arithmetic_intensity",
    "plot_roofline",
    "slot_utilization",
    "plot_slot_timeline",
    "block_table_snapshot",
    "plot_block_table",
    "plot_speculative",
    "kv_head_label",
    "plot_gqa_decode",
]

_KIND_LABELS = {"static": "静态批处理", "continuous": "连续批处理"}


# ---------------------------------------------------------------- 批槽位时间线


def _check_slot_steps(slot_steps, name: str) -> list[list[tuple[int, int]]]:
    if isinstance(slot_steps, (str, bytes)) or not isinstance(slot_steps, Sequence):
        raise TypeError(f"{name} 应是每个请求一个 [(步, 槽位), …] 列表，收到 {type(slot_steps).__name__}")
    out = []
    for i, steps in enumerate(slot_steps):
        try:
            pairs = [(int(s), int(b)) for s, b in steps]
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name}[{i}] 应是 [(步, 槽位), …]，收到 {steps!r:.60}") from exc
        if any(s < 0 or b < 0 for s, b in pairs):
            raise ValueError(f"{name}[{i}] 里的步号与槽位号应非负，收到 {pairs[:4]}…")
        out.append(pairs)
    return out


def _grid(slot_steps: list[list[tuple[int, int]]], max_batch: int | None) -> np.ndarray:
    """``(槽位, 2·步数)`` 的请求号表（-1 = 空）：每步两格。调度器若在同一步里先让一条序列结束、再让新请求接手
    同一个槽位（本书的引擎每步只做一次前向，不会这样；别的调度可能会），那一步左格是旧请求、右格是新请求；
    只有一个请求时两格都是它。"""
    steps = max((s for r in slot_steps for s, _ in r), default=-1) + 1
    slots = max((b for r in slot_steps for _, b in r), default=-1) + 1
    if max_batch is not None and slots > max_batch:
        raise ValueError(f"时间线用到了槽位 {slots - 1}，但 max_batch={max_batch}：槽位号应在 [0, max_batch) 内")
    slots = max(slots, max_batch or 0)
    grid = np.full((slots, 2 * steps), -1, dtype=int)
    first = {rid: min((s for s, _ in pairs), default=0) for rid, pairs in enumerate(slot_steps)}
    for rid in sorted(first, key=lambda r: (first[r], r)):  # 先开始的请求先填
        for s, b in slot_steps[rid]:
            left, right = grid[b, 2 * s], grid[b, 2 * s + 1]
            if left == -1:
                grid[b, 2 * s: 2 * s + 2] = rid
            elif left == right:
                grid[b, 2 * s + 1] = rid
            else:
                raise ValueError(f"第 {s} 步的槽位 {b} 被三个请求（{left}、{right}、{rid}）占用")
    return grid


def _busy(grid: np.ndarray) -> int:
    """被占用的（步, 槽位）格数。"""
    return int(((grid[:, 0::2] >= 0) | (grid[:, 1::2] >= 0)).sum())


def slot_utilization(slot_steps, max_batch: int) -> dict:
    """一份时间线（每个请求的 ``[(步, 槽位), …]``，即 :class:`~tformer_lib.serving.Request` 的 ``slot_steps``）的
    步数、被占用的格数与利用率 = 占用格数 ÷ (步数 × ``max_batch``)。"""
    pairs = _check_slot_steps(slot_steps, "slot_steps")
    max_batch = positive_int("max_batch", max_batch)
    grid = _grid(pairs, max_batch)
    busy = _busy(grid)
    steps = grid.shape[1] // 2
    return {"steps": steps, "busy": busy, "utilization": busy / (steps * max_batch) if steps else 0.0}


def plot_slot_timeline(timeline: Mapping[str, Sequence] | Sequence, *, max_batch: int | None = None,
                       title: str | None = None, show_ids: bool | None = None):
    """哪个请求在哪一步占着哪个批槽位：每种调度一个面板，上下排列、横轴（引擎步）对齐，一色一个请求，白格是空槽。

    ``timeline``：``{"static": [...], "continuous": [...]}``（:func:`~tformer_lib.serving.measure.batching_benchmark`
    结果里的 ``"timeline"``），每个值是每个请求的 ``[(步, 槽位), …]``；也可以只给一份列表。
    面板标题写出步数与槽位利用率（:func:`slot_utilization`）。``show_ids``：格子里写请求号（默认：格子不太多时写）。
    """
    from matplotlib.colors import ListedColormap

    if isinstance(timeline, Mapping):
        if not timeline:
            raise ValueError("timeline 为空：应是 {调度名: 每个请求的 [(步, 槽位), …]}")
        kinds = {k: _check_slot_steps(v, f"timeline[{k!r}]") for k, v in timeline.items()}
    else:
        kinds = {"": _check_slot_steps(timeline, "timeline")}
    if max_batch is not None:
        max_batch = positive_int("max_batch", max_batch)
    grids = {k: _grid(v, max_batch) for k, v in kinds.items()}
    if all(g.shape[1] == 0 for g in grids.values()):
        raise ValueError("timeline 里没有任何 (步, 槽位)：每个请求的列表都是空的，没有可画的步")
    slots = max(g.shape[0] for g in grids.values())
    steps = max(g.shape[1] for g in grids.values()) // 2
    n_requests = max(len(v) for v in kinds.values())
    fig, axes = new_figure((min(13.0, 3.0 + 0.12 * steps), 0.9 + len(grids) * (0.5 + 0.22 * slots)),
                           nrows=len(grids), ncols=1)
    axes = np.atleast_2d(axes).reshape(-1, 1)  # 只有一个面板时 new_figure 返回单个 Axes
    base = [tuple(c) for c in matplotlib.colormaps["tab20"].colors]
    cmap = ListedColormap([(1.0, 1.0, 1.0)] + [base[i % len(base)] for i in range(max(n_requests, 1))])
    show = show_ids if show_ids is not None else steps * slots <= 1200
    for ax, (kind, grid) in zip(axes[:, 0], grids.items()):
        full = np.full((slots, 2 * steps), -1, dtype=int)
        full[: grid.shape[0], : grid.shape[1]] = grid
        ax.imshow(full + 1, cmap=cmap, vmin=0, vmax=max(n_requests, 1), aspect="auto", interpolation="nearest",
                  extent=(-0.5, steps - 0.5, slots - 0.5, -0.5))
        if steps <= 120:  # 步数多时每步一条竖线会糊成一片
            ax.set_xticks(np.arange(-0.5, steps, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, slots, 1), minor=True)
        ax.grid(which="minor", color="#dddddd", lw=0.4)
        ax.tick_params(which="minor", length=0)
        ax.set_yticks(range(slots))
        if show:
            for b in range(slots):
                for s in range(steps):
                    a, z = full[b, 2 * s], full[b, 2 * s + 1]
                    if a >= 0 and a == z:
                        ax.text(s, b, str(a), ha="center", va="center", fontsize=5, color="#222222")
                    else:
                        for offset, rid in ((-0.25, a), (0.25, z)):
                            if rid >= 0:
                                ax.text(s + offset, b, str(rid), ha="center", va="center", fontsize=4, color="#222222")
        width = max_batch or slots
        name = _KIND_LABELS.get(kind, kind)
        head = f"{name}：" if name else ""
        n_steps = grid.shape[1] // 2
        ax.set_title(f"{head}{n_steps} 步，槽位利用率 {_busy(grid) / max(1, n_steps * width):.0%}", fontsize=10)
        ax.set_ylabel("批槽位")
    axes[-1, 0].set_xlabel("引擎步（每步每个槽位产出一个词元；格中数字 = 请求号）" if show else "引擎步")
    if title:
        fig.suptitle(title)
    return fig


# ---------------------------------------------------------------- 分页缓存的块表


def block_table_snapshot(manager) -> dict:
    """把一个 :class:`~tformer_lib.serving.BlockManager` 此刻的状态抄成普通字典（之后管理器再变，快照也不变）。

    ``{"num_blocks", "block_size", "tables": {序列: [物理块…]}, "lengths": {序列: 已写位置数},
    "ref_count": [...], "free": [...], "prefix_blocks": [登记为可共用前缀的块…]}``
    """
    from tformer_lib.serving.block_manager import BlockManager

    if not isinstance(manager, BlockManager):
        raise TypeError(f"manager 应是 BlockManager（PagedKVCache 的 .manager），收到 {type(manager).__name__}")
    return {"num_blocks": manager.num_blocks, "block_size": manager.block_size,
            "tables": {int(s): list(t) for s, t in manager.tables.items()},
            "lengths": {int(s): int(n) for s, n in manager.lengths.items()},
            "ref_count": list(manager.ref_count), "free": sorted(manager.free_blocks),
            "prefix_blocks": manager.prefix_blocks}


def _as_snapshot(state) -> dict:
    if isinstance(state, Mapping):
        missing = {"num_blocks", "block_size", "tables", "lengths", "ref_count"} - set(state)
        if missing:
            raise ValueError(f"快照缺少这些键：{sorted(missing)}（用 block_table_snapshot(manager) 得到）")
        return dict(state)
    if hasattr(state, "manager"):  # PagedKVCache
        state = state.manager
    return block_table_snapshot(state)


def plot_block_table(state, *, title: str | None = None, columns: int | None = None):
    """分页缓存的一刻：左边每条序列的块表（逻辑块 → 物理块号，块内深色部分 = 已写入的位置），右边全部物理块。

    ``state``：``BlockManager``、``PagedKVCache`` 或 :func:`block_table_snapshot` 的快照。一色一条序列；
    被几条序列共用的前缀块（引用计数 > 1）画成金色并标出 “×引用数”；白格是空闲块。
    """
    from matplotlib.patches import Rectangle

    snap = _as_snapshot(state)
    if columns is not None:
        columns = positive_int("columns", columns)
    n_blocks, size = int(snap["num_blocks"]), int(snap["block_size"])
    tables, lengths, refs = snap["tables"], snap["lengths"], snap["ref_count"]
    palette = [tuple(c) for c in matplotlib.colormaps["tab10"].colors]
    shared = "#e6b422"
    seqs = sorted(tables)
    color_of = {s: palette[i % len(palette)] for i, s in enumerate(seqs)}
    owner: dict[int, int] = {}
    for s in seqs:
        for b in tables[s]:
            owner.setdefault(b, s)
    columns = columns or min(16, max(4, int(np.ceil(np.sqrt(n_blocks * 2)))))
    grid_rows = -(-n_blocks // columns)
    width_blocks = max((len(tables[s]) for s in seqs), default=1)
    height = 1.4 + 0.42 * max(len(seqs), grid_rows, 2)
    fig = blank_figure((4.0 + 0.55 * width_blocks + 0.45 * columns, height))
    fig.set_layout_engine("none")  # 格子与文字很多时 constrained 布局很慢；两栏的位置手工给出（存图时再裁掉白边）
    top = 1 - (0.75 if title else 0.4) / height  # 留出总标题与两栏标题的高度（英寸换成比例）
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [max(width_blocks, 2) + 2.5, columns], "wspace": 0.08,
                                                  "left": 0.02, "right": 0.98, "bottom": 0.55 / height, "top": top})
    # 左：每条序列的块表
    for row, s in enumerate(seqs):
        left.text(-0.6, row, f"序列 {s}（{lengths.get(s, 0)} 位）", ha="right", va="center", fontsize=8)
        for i, b in enumerate(tables[s]):
            filled = min(size, max(0, lengths.get(s, 0) - i * size)) / size
            is_shared = refs[b] > 1
            color = shared if is_shared else color_of[s]
            left.add_patch(Rectangle((i - 0.45, row - 0.38), 0.9, 0.76, facecolor="white", edgecolor=color, lw=1.5))
            left.add_patch(Rectangle((i - 0.45, row - 0.38), 0.9 * filled, 0.76, facecolor=color, alpha=0.55, lw=0))
            left.text(i, row, f"{b}" + (f"\n×{refs[b]}" if is_shared else ""), ha="center", va="center", fontsize=7)
    left.set_xlim(-3.2, max(width_blocks, 2) - 0.4)
    left.set_ylim(max(len(seqs), 1) - 0.5, -0.6)
    left.set_xticks(range(width_blocks))
    left.set_xlabel("逻辑块号（格中 = 物理块号）")
    left.set_yticks([])
    for side in ("top", "right", "left"):
        left.spines[side].set_visible(False)
    left.set_title(f"块表：每块 {size} 个位置", fontsize=10)
    # 右：物理块
    for b in range(n_blocks):
        r, c = divmod(b, columns)
        if refs[b] == 0:
            face, text = "white", f"{b}"
        elif refs[b] > 1:
            face, text = shared, f"{b}\n×{refs[b]}"
        else:
            face, text = color_of.get(owner.get(b), "#cccccc"), f"{b}"
        right.add_patch(Rectangle((c - 0.45, r - 0.45), 0.9, 0.9, facecolor=face, edgecolor="#999999",
                                  alpha=0.75 if refs[b] else 1.0, lw=0.8))
        right.text(c, r, text, ha="center", va="center", fontsize=6.5)
    right.set_xlim(-0.6, columns - 0.4)
    right.set_ylim(grid_rows - 0.4, -0.6)
    right.set_aspect("equal")
    right.axis("off")
    used = sum(1 for x in refs if x > 0)
    right.set_title(f"物理块：{used}/{n_blocks} 块在用，{sum(1 for x in refs if x > 1)} 块被共用", fontsize=10)
    if title:
        fig.suptitle(title, y=1 - 0.1 / height, va="top")
    return fig


# ---------------------------------------------------------------- 推测解码


def plot_speculative(result: Mapping, *, title: str | None = None):
    """推测解码的测量（:func:`~tformer_lib.serving.measure.speculative_benchmark` 的结果）与公式并排，三个面板各用自己的纵轴：

    左：每个 k 的接受率 α（柱，0–1）；中：每次目标前向实际产出的词元数（点）与公式 (1−α^{k+1})/(1−α)（线），
    虚线是上限 k + 1；右：实测加速比（中位数，竖线 = 各轮的范围）与期望加速比 (1−α^{k+1}) / ((1−α)(kc+1))
    （c = 草稿/目标的开销比）。α 与“词元/次”单位不同，不共用一根纵轴。
    """
    from tformer_lib.serving.speculative import expected_tokens_per_pass

    rows = result.get("rows") if isinstance(result, Mapping) else None
    if not rows:
        raise ValueError("result 应是 speculative_benchmark 的结果（含非空的 'rows'）")
    need = {"k", "acceptance_rate", "tokens_per_target_pass", "speedup_median", "expected_speedup"}
    checked = []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping) or not need <= set(row):
            missing = sorted(need - set(row)) if isinstance(row, Mapping) else sorted(need)
            raise ValueError(f"result['rows'] 的每一行应含 {sorted(need)}，rows[{i}] 缺 {missing}")
        k = positive_int(f"result['rows'][{i}]['k']", row["k"])
        numbers = {key: finite_number(row[key], f"result['rows'][{i}]['{key}']") for key in sorted(need - {"k"})}
        if not 0 <= numbers["acceptance_rate"] <= 1:
            raise ValueError(f"result['rows'][{i}]['acceptance_rate'] 应是 0 到 1 的比例，收到 {numbers['acceptance_rate']:g}")
        spread = row.get("speedups")
        if spread is not None:
            spread = finite_array(spread, f"result['rows'][{i}]['speedups']").ravel().tolist()
        checked.append({**row, **numbers, "k": int(k), "speedups": spread})
    rows = checked
    if result.get("cost_ratio") is not None:
        finite_number(result["cost_ratio"], "result['cost_ratio']")
    ks = np.array([r["k"] for r in rows])
    alpha = np.array([r["acceptance_rate"] for r in rows])
    fig, axes = new_figure((12.6, 3.8), nrows=1, ncols=3)
    left, middle, right = axes[0]
    left.bar(ks, alpha, width=0.5, color="#9ecae1")
    left.set_ylim(0, 1.05)
    left.set_ylabel("接受率 α")
    left.set_title("草稿的词元被接受的比例", fontsize=10)
    middle.plot(ks, [float(r["tokens_per_target_pass"]) for r in rows], "o", color="#08519c", ms=7,
                label="实测")
    middle.plot(ks, [expected_tokens_per_pass(a, int(k)) for a, k in zip(alpha, ks)], "x--", color="#e6550d", ms=8,
                label="公式 (1−α^(k+1))/(1−α)")
    middle.plot(ks, ks + 1, ":", color="#777777", label="上限 k + 1（全部接受）")
    middle.set_ylim(0, max(ks) + 1.5)
    middle.set_ylabel("词元 / 次目标前向")
    middle.legend(fontsize=7, loc="upper left")
    middle.set_title("每次验证产出几个词元", fontsize=10)
    for ax in (left, middle, right):
        ax.set_xticks(ks)
        ax.set_xlabel("每次猜的词元数 k")
        ax.grid(alpha=0.3)
    med = np.array([float(r["speedup_median"]) for r in rows])
    for k, r in zip(ks, rows):
        spread = r.get("speedups")
        if spread:
            right.vlines(k, min(spread), max(spread), color="#2ca02c", lw=2, alpha=0.5)
    right.plot(ks, med, "o-", color="#2ca02c", label="实测加速比（中位数，竖线 = 各轮范围）")
    c = result.get("cost_ratio")
    right.plot(ks, [float(r["expected_speedup"]) for r in rows], "x--", color="#e6550d", ms=8,
               label="期望加速比" + (f"（c = {float(c):.2f}）" if c is not None else ""))
    right.axhline(1.0, color="#333333", lw=0.8)
    right.set_ylabel("相对只用目标模型的加速比")
    right.legend(fontsize=7)
    right.set_title("加速比：实测 vs 公式", fontsize=10)
    if title:
        fig.suptitle(title)
    return fig


# ---------------------------------------------------------------- GQA 的解码时间

_KV_LABELS = {"MHA": "#d62728", "GQA": "#1f77b4", "MQA": "#2ca02c"}


def kv_head_label(n_kv_heads: int, n_heads: int) -> str:
    """``n_kv_heads`` 的名字：等于 ``n_heads`` 是 MHA，1 是 MQA，其余是 GQA（括号里写出 h_kv）。"""
    kind = "MHA" if n_kv_heads == n_heads else "MQA" if n_kv_heads == 1 else "GQA"
    return f"{kind}（h_kv={n_kv_heads}）"


def plot_gqa_decode(result: Mapping, *, title: str | None = None):
    """GQA 解码测量（:func:`~tformer_lib.serving.gqa_decode.gqa_decode_benchmark` 的结果，或读出的结果文件）的两个面板：

    左：每种 K/V 头数解码一步的毫秒数随缓存长度变化（点 = 中位数，竖线 = 上下四分位；对数纵轴）。不画最小到最大：
    机器上有别的任务时，个别轮次会慢上十几倍，那样的竖线会把中位数压扁在图底；
    右：相对 MHA 的逐轮耗时比（中位数与四分位范围）与屋顶线的预测（搬动字节之比，虚线）。
    """
    if not isinstance(result, Mapping):
        raise ValueError(f"result 应是 gqa_decode_benchmark 的结果（字典），收到 {type(result).__name__}")
    rows = result.get("rows")
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows:
        raise ValueError("result 应含非空的 'rows'（每个缓存长度一行）")
    n_heads = result.get("model", {}).get("n_heads") if isinstance(result.get("model"), Mapping) else None
    kv_heads = result.get("kv_heads")
    if not isinstance(n_heads, int) or not isinstance(kv_heads, Sequence) or not kv_heads:
        raise ValueError("result 应含 'model'['n_heads'] 与非空的 'kv_heads'")
    need = ("median", "q1", "q3", "ratio_to_base", "predicted_ratio_to_base")
    contexts, data = [], {h: {k: [] for k in (*need[:3], "r_med", "r_q1", "r_q3", "pred")} for h in kv_heads}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping) or "context" not in row or not isinstance(row.get("variants"), Mapping):
            raise ValueError(f"result['rows'][{i}] 应含 'context' 与 'variants'")
        contexts.append(finite_number(row["context"], f"result['rows'][{i}]['context']"))
        for h in kv_heads:
            v = row["variants"].get(str(h))
            if not isinstance(v, Mapping) or any(k not in v for k in need):
                raise ValueError(f"result['rows'][{i}]['variants']['{h}'] 缺少字段（应含 {list(need)}）")
            for k in need[:3]:
                data[h][k].append(finite_number(v[k], f"result['rows'][{i}]['variants']['{h}']['{k}']") * 1e3)
            for k, key in (("r_med", "median"), ("r_q1", "q1"), ("r_q3", "q3")):
                data[h][k].append(finite_number(v["ratio_to_base"][key],
                                                f"result['rows'][{i}]['variants']['{h}']['ratio_to_base']['{key}']"))
            data[h]["pred"].append(finite_number(v["predicted_ratio_to_base"],
                                                 f"result['rows'][{i}]['variants']['{h}']['predicted_ratio_to_base']"))
    x = np.array(contexts)
    fig, axes = new_figure((12.0, 4.2), nrows=1, ncols=2)
    left, right = axes[0]
    for j, h in enumerate(kv_heads):
        d = {k: np.array(v) for k, v in data[h].items()}
        label = kv_head_label(int(h), n_heads)
        color = _KV_LABELS[label[:3]]
        shift = x * (1 + 0.04 * (j - 1))  # 各组稍微错开，竖线不互相遮挡
        left.vlines(shift, d["q1"], d["q3"], color=color, lw=3, alpha=0.8)  # 上下四分位
        left.plot(shift, d["median"], "o-", color=color, ms=4, label=label)  # 中位数
        if j:
            right.vlines(shift, d["r_q1"], d["r_q3"], color=color, lw=3, alpha=0.8)
            right.plot(shift, d["r_med"], "o-", color=color, ms=4, label=f"{label} 实测（中位数与四分位）")
            right.plot(x, d["pred"], "x--", color=color, ms=7, alpha=0.8, label=f"{label} 字节之比（屋顶线的预测）")
    right.axhline(1.0, color="#333333", lw=0.8)
    left.set_ylabel("解码一步（毫秒，对数刻度）")
    left.set_yscale("log")
    low = min(min(data[h]["q1"]) for h in kv_heads)
    high = max(max(data[h]["q3"]) for h in kv_heads)
    ticks = [t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000) if low / 2 <= t <= high * 2]
    if ticks:  # 对数刻度上标几个整齐的毫秒数，不用 10 的幂次记法
        left.set_yticks(ticks)
    left.yaxis.set_major_formatter(ScalarFormatter())
    left.yaxis.set_minor_formatter(NullFormatter())
    left.set_title(f"解码一步的耗时（B={result.get('batch')}，{result.get('rounds')} 轮交替）\n"
                   "点 = 中位数，竖线 = 上下四分位", fontsize=10)
    right.set_ylabel("÷ MHA")
    right.set_ylim(0, 1.1)
    right.set_title("相对 MHA：实测耗时比 vs 搬动字节之比", fontsize=10)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(x)
        ax.set_xticklabels([str(int(t)) for t in x])
        ax.set_xlabel("缓存里已有的位置数 T")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return fig
