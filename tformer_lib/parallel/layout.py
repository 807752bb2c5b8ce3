"""张量并行 × 流水线并行（TP × PP）的布局下，每张卡存多少个参数——只看配置，在 meta 设备上数模型自己的参数。

切法与第 12 章的手写方案相同（:mod:`.tensor_parallel`、:mod:`.pipeline`，测试逐项对照）：

* 张量并行 t 份（Megatron）：W^Q、W^K、W^V、W_1（SwiGLU 还有 W_3）按列切，权重与偏置各 1/t；W^O、W_2 按行切，
  权重 1/t、偏置每卡一份完整的；归一化的参数每卡一份。词嵌入与输出层按 Megatron 的词表并行（vocab-parallel）
  切成 t 份（词表除不尽时按 ⌈V/t⌉ 行计——Megatron 会把词表补齐到 t 的倍数）；可学习的位置嵌入每卡一份。
  第 12 章的手写方案只切注意力与 FFN，嵌入不切；这里按真实训练的做法切。
* 流水线 p 段：块按 :func:`~tformer_lib.parallel.pipeline.split_points` 均分；第一段另有词嵌入（与位置嵌入），
  最后一段另有末层归一化与输出层。输出层与词嵌入共享且 p > 1 时，最后一段另存一份词嵌入（Megatron 的做法，
  反向后两段把这个矩阵的梯度 all-reduce 一次）。
"""

from __future__ import annotations

import math

from .._checks import positive_int
from ..lm.config import LMConfig
from ..lm.meta import meta_lm
from .pipeline import split_points

__all__ = ["TP_SPLITS", "tensor_parallel_split", "layout_parameters_per_rank"]

#: 块内每个线性层在张量并行下的切法
TP_SPLITS = {"w_q": "column", "w_k": "column", "w_v": "column", "w_1": "column", "w_3": "column",
             "w_o": "row", "w_2": "row"}


def tensor_parallel_split(name: str) -> str:
    """参数 ``name`` 在张量并行下怎么放：``"column"`` / ``"row"``（各切 t 份）、``"vocab"``（词表切 t 份）
    或 ``"replicated"``（每卡一份完整的）。行切的偏置在 all-reduce 之后只加一次，所以是 ``"replicated"``。"""
    parts = name.split(".")
    if parts[0] in ("tok_embed", "lm_head"):
        return "vocab"
    if len(parts) >= 2 and parts[-2] in TP_SPLITS:
        split = TP_SPLITS[parts[-2]]
        return "replicated" if split == "row" and parts[-1] == "bias" else split
    return "replicated"


def layout_parameters_per_rank(config: LMConfig, tensor_parallel: int = 1, pipeline_stages: int = 1) -> list[int]:
    """TP = ``tensor_parallel``、PP = ``pipeline_stages`` 时，每一段里一张卡存的参数个数（列表，第 s 项是第 s 段）。

    要求头数、K/V 头数与 d_ff 都能被 t 整除（否则一个头会被切开），段数不超过层数。
    """
    if not isinstance(config, LMConfig):
        raise TypeError(f"config 应是 LMConfig，收到 {type(config).__name__}")
    t, p = positive_int("tensor_parallel", tensor_parallel), positive_int("pipeline_stages", pipeline_stages)
    for what, size in (("n_heads", config.n_heads), ("n_kv_heads", config.kv_heads), ("d_ff", config.d_ff)):
        if size % t != 0:
            raise ValueError(f"{what}={size} 不能被 tensor_parallel={t} 整除：张量并行要把每个头、每列完整地分给一张卡")
    stages = split_points(config.n_layers, p)  # 段数多于层数时它给出清楚的错误
    stage_of_block = {i: s for s, (start, stop) in enumerate(stages) for i in range(start, stop)}
    counts = [0] * p
    for name, param in meta_lm(config).named_parameters():
        split = tensor_parallel_split(name)
        if split == "vocab":
            rows, cols = param.shape  # (V, d)
            n = math.ceil(rows / t) * cols
        else:
            n = param.numel() // t if split in ("column", "row") else param.numel()
        if name.startswith("blocks."):
            stage = stage_of_block[int(name.split(".")[1])]
        else:
            stage = 0 if name.startswith(("tok_embed.", "pos_embed.")) else p - 1  # 末层归一化与输出层在最后一段
        counts[stage] += n
        if name == "tok_embed.weight" and config.tie_embeddings and p > 1:
            counts[p - 1] += n  # 共享的输出层：最后一段另存一份
    return counts
