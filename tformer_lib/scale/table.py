"""每章一张账本表：``ledger_table(chapter, presets=...)`` 给出行的列表，``format_table`` 把它排成文本表格。"""

from __future__ import annotations

from ..lm.presets import PRESETS
from .accelerators import GB
from .ledger import compute_row, context_parallel_rows, memory_row, parallel_rows, parameter_row, serving_row

__all__ = ["LEDGER_CHAPTERS", "DEFAULT_MODELS", "ledger_table", "format_table"]

#: 章号 → 这一章的行函数（第 12 章一个模型给出多行：每种布局一行；第 16 章每个上下文并行度一行）
LEDGER_CHAPTERS = {9: compute_row, 10: parameter_row, 11: memory_row, 12: parallel_rows, 13: serving_row,
                   16: context_parallel_rows}
#: 默认的模型：随书的唐诗模型，加上全部预设
DEFAULT_MODELS = ("poem", *PRESETS)


def ledger_table(chapter: int, presets=DEFAULT_MODELS, **options) -> list[dict]:
    """第 ``chapter`` 章（9–13 与 16）的账本：``presets`` 里每个模型（预设名、``"poem"`` 或 LMConfig）一行（第 12 章
    每种并行布局一行，第 16 章每个上下文并行度 cp 一行）。``options`` 原样交给这一章的行函数（例如
    ``context=4096``、``micro_batch=1``、``world_size=8``；第 16 章 ``cp_sizes=(1, 2, 4, 8)``）。"""
    if isinstance(chapter, bool) or chapter not in LEDGER_CHAPTERS:
        raise ValueError(f"chapter 应是 {sorted(LEDGER_CHAPTERS)} 之一，收到 {chapter!r}")
    if isinstance(presets, str):
        presets = (presets,)
    row_fn = LEDGER_CHAPTERS[chapter]
    rows = []
    for model in presets:
        out = row_fn(model, **options)
        rows.extend(out if isinstance(out, list) else [out])
    return rows


def _cell(key: str, value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "是" if value else "否"
    if key.endswith("_bytes") or key.endswith("_bytes_per_gpu"):
        if value < 0.01 * GB:
            return f"{value:,.0f} B"
        return f"{value / GB:,.3g} GB" if value < 1000 * GB else f"{value / GB:,.0f} GB"
    if key.endswith("_flops"):
        return f"{value:.3g}"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_table(rows: list[dict], columns=None) -> str:
    """把 :func:`ledger_table` 的行排成对齐的文本表格：字节数以十进制 GB 显示（不足 0.01 GB 时显示字节），
    FLOPs 用科学计数法，其余数三位有效数字；``columns`` 选列（默认全部）。"""
    if not rows:
        return ""
    columns = list(columns or rows[0])
    cells = [[_cell(k, row.get(k)) for k in columns] for row in rows]
    widths = [max(len(k), *(len(r[i]) for r in cells)) for i, k in enumerate(columns)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in cells]
    return "\n".join(lines)
