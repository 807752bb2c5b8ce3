r"""真实规模的账本（ledger）：第 9–13 章与第 16 章在随书小模型上逐字节核对过的公式，原样用到 7B–70B 的真实模型上。

这里不推导新公式，每一行都调用各章自己的函数（模型用 :data:`~tformer_lib.lm.PRESETS` 的配置在 meta 设备上搭）：

=====  ==========================================================================================
章     用到的函数
=====  ==========================================================================================
9      :func:`~tformer_lib.measurement.profiling.lm_training_flops`（每个词元的训练 FLOPs，与 6N 对照）
10     :func:`~tformer_lib.lm.parameter_breakdown`、:func:`~tformer_lib.lm.lm_kv_cache_bytes_per_token`
11     :func:`~tformer_lib.measurement.memory.training_memory`、:func:`~tformer_lib.measurement.memory.korthikanti_activation_bytes`
12     :func:`~tformer_lib.parallel.zero.zero_bytes_per_rank`、:func:`~tformer_lib.parallel.layout.layout_parameters_per_rank`、
       :mod:`~tformer_lib.parallel.comm` 的载荷公式、:func:`~tformer_lib.parallel.pipeline.bubble_fraction`
13     :func:`~tformer_lib.serving.roofline.decode_cost`、:func:`~tformer_lib.serving.roofline.attainable_flops`
16     :func:`~tformer_lib.measurement.memory.lm_activation_bytes`（在每卡的本地长度上）、
       :func:`~tformer_lib.parallel.ring_attention.ring_attention_payload`、
       :func:`~tformer_lib.parallel.ring_attention.ring_attention_saved_bytes`、:func:`~tformer_lib.parallel.ulysses.ulysses_payload`
=====  ==========================================================================================

每个函数接收预设名（``"llama-2-7b"``）、``"poem"``（随书的唐诗模型，配置与训练词元数读自随书检查点）或一个
:class:`~tformer_lib.lm.LMConfig`，返回一行（普通字典：字节数以 ``_bytes`` 结尾，FLOPs 以 ``_flops`` 结尾）。
第 9–13 章：上下文长度超过模型的 ``max_len`` 时按 ``max_len`` 算，并记在行里的 ``context`` 上。第 16 章不截断——
长上下文训练正是要把模型推到它原来的训练长度之外——按所给的长度算，行里另记 ``max_len`` 与 ``beyond_max_len``。
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from .._checks import one_of, positive_int, positive_ints
from ..lm.cache import lm_kv_cache_bytes_per_token
from ..lm.config import LMConfig
from ..lm.meta import parameter_breakdown
from ..lm.presets import PRESETS, PUBLISHED_TRAINING_TOKENS
from ..measurement.memory import (
    KORTHIKANTI_RECOMPUTE,
    korthikanti_activation_bytes,
    lm_activation_bytes,
    model_state_bytes,
    training_memory,
)
from ..measurement.profiling import lm_training_flops
from ..parallel.comm import data_parallel_payload, pipeline_payload, ring_all_reduce_bytes, tensor_parallel_payload
from ..parallel.layout import layout_parameters_per_rank
from ..parallel.pipeline import bubble_fraction, split_points
from ..parallel.ring_attention import LAYOUTS, ring_attention_payload, ring_attention_saved_bytes
from ..parallel.ulysses import ulysses_payload
from ..parallel.zero import ZERO_STAGES, zero_bytes_per_rank
from ..serving.roofline import attainable_flops, decode_cost
from .accelerators import ACCELERATORS, GB

__all__ = ["CHINCHILLA_TOKENS_PER_PARAMETER", "training_compute_flops", "chinchilla_tokens", "resolve_model",
           "compute_row", "parameter_row", "memory_row", "parallel_rows", "serving_row", "context_parallel_rows"]

#: Hoffmann et al.（2022，Chinchilla）：算力最优时每个参数约 20 个训练词元
CHINCHILLA_TOKENS_PER_PARAMETER = 20
#: 混合精度训练（bf16 参数与梯度 + fp32 主权重与两个矩）每个参数的字节：2 + 2 + 12（ZeRO 论文的 K = 12）
_MIXED = dict(param_bytes=2, grad_bytes=2, optimizer_bytes=12)


def training_compute_flops(n_params: int, tokens: int) -> int:
    """训练算力的常用近似 C ≈ 6·N·D（Kaplan et al., 2020）：每个词元前向 2N、反向 4N 次浮点运算。

    它略去了注意力里随上下文增长的 QKᵀ、AV 两项；:func:`compute_row` 把它与
    :func:`~tformer_lib.measurement.profiling.lm_training_flops` 逐项数出的值放在一起。"""
    return 6 * positive_int("n_params", n_params) * positive_int("tokens", tokens)


def chinchilla_tokens(n_params: int, tokens_per_parameter: int = CHINCHILLA_TOKENS_PER_PARAMETER) -> int:
    """Chinchilla 法则给 N 个参数的模型的训练词元数 ≈ 20·N。"""
    return positive_int("n_params", n_params) * positive_int("tokens_per_parameter", tokens_per_parameter)


@lru_cache(maxsize=1)
def _poem() -> tuple[LMConfig, int]:
    from ..lm.pretrained import load_poem_model

    model, _, checkpoint = load_poem_model()
    return model.config, int(checkpoint["extra"]["tokens_seen"])


def resolve_model(model: str | LMConfig) -> tuple[str, LMConfig]:
    """``(名字, 配置)``：预设名、``"poem"``（随书检查点的配置）或 :class:`~tformer_lib.lm.LMConfig`（名字记 ``"custom"``）。"""
    if isinstance(model, LMConfig):
        return "custom", model
    if model == "poem":
        return "poem", dataclasses.replace(_poem()[0])
    if isinstance(model, str) and model in PRESETS:
        return model, dataclasses.replace(PRESETS[model])
    raise ValueError(f"model 应是 'poem'、{sorted(PRESETS)} 之一或一个 LMConfig，收到 {model!r}")


def _trained_tokens(name: str) -> int | None:
    """公布的（预设）或随书检查点里记下的（poem）训练词元数；没有公布的是 None。"""
    return _poem()[1] if name == "poem" else PUBLISHED_TRAINING_TOKENS.get(name)


def _params(config: LMConfig) -> dict[str, int]:
    key = tuple(sorted(config.to_dict().items()))
    return dict(_params_cached(key))


@lru_cache(maxsize=64)
def _params_cached(key: tuple) -> tuple:
    return tuple(parameter_breakdown(LMConfig(**dict(key))).items())


def _context(config: LMConfig, context: int) -> int:
    return min(positive_int("context", context), config.max_len)


def compute_row(model: str | LMConfig, context: int = 4096) -> dict:
    """第 9 章：参数 N、Chinchilla 词元 20N 与算力 6·N·20N、公布的训练词元与每参数词元数，以及在 ``context``
    长度上逐项数出的每词元训练 FLOPs（:func:`~tformer_lib.measurement.profiling.lm_training_flops`）与 6N 之比。"""
    name, c = resolve_model(model)
    n = _params(c)["total"]
    ctx = _context(c, context)
    tokens = _trained_tokens(name)
    per_token = lm_training_flops(c, 1, ctx)["total"] / ctx
    return {
        "name": name, "params": n, "chinchilla_tokens": chinchilla_tokens(n),
        "chinchilla_flops": training_compute_flops(n, chinchilla_tokens(n)),
        "trained_tokens": tokens, "tokens_per_param": None if tokens is None else tokens / n,
        "trained_flops": None if tokens is None else training_compute_flops(n, tokens),
        "context": ctx, "counted_flops_per_token": per_token, "counted_over_6n": per_token / (6 * n),
    }


def parameter_row(model: str | LMConfig, kv_bytes_per_element: int = 2) -> dict:
    """第 10 章：参数按部件（词嵌入、位置、注意力、FFN、归一化、输出层），以及每个词元的 K/V 缓存字节数——
    模型自己的 K/V 头数与“假如是普通 MHA”各一份（默认 fp16，2 字节）。"""
    name, c = resolve_model(model)
    parts = _params(c)
    kv = lm_kv_cache_bytes_per_token(c, kv_bytes_per_element)
    kv_mha = lm_kv_cache_bytes_per_token(dataclasses.replace(c, n_kv_heads=None), kv_bytes_per_element)
    return {"name": name, **parts, "n_heads": c.n_heads, "kv_heads": c.kv_heads,
            "kv_bytes_per_token": kv, "kv_bytes_per_token_mha": kv_mha, "mha_over_gqa": kv_mha / kv}


def memory_row(model: str | LMConfig, context: int = 4096, micro_batch: int = 1,
               memory_bytes: int = 80 * GB) -> dict:
    """第 11 章：混合精度 + AdamW 训练一步的显存（bf16 参数与梯度、fp32 主权重与两个矩，16 字节/参数），
    激活按本书实现的公式（:func:`~tformer_lib.measurement.memory.lm_activation_bytes`，每个元素 2 字节，快速注意力路径）算，
    重算与不重算各一份；旁边是 Korthikanti et al.（2022）的三种重算方式。``fits`` 与一张 ``memory_bytes``
    的卡比（打开重算时峰值另加重算一块的量）。"""
    name, c = resolve_model(model)
    n = _params(c)["total"]
    ctx = _context(c, context)
    positive_int("micro_batch", micro_batch)
    plain = training_memory(n, c, micro_batch, ctx, "mixed", checkpointing=False, bytes_per_element=2)
    ckpt = training_memory(n, c, micro_batch, ctx, "mixed", checkpointing=True, bytes_per_element=2)
    states = plain["total"] - plain["activations"]
    row = {"name": name, "params": n, "context": ctx, "micro_batch": micro_batch,
           "weights_bytes": plain["params"], "grads_bytes": plain["grads"],
           "optimizer_bytes": plain["master"] + plain["adam_m"] + plain["adam_v"], "model_states_bytes": states,
           "activations_bytes": plain["activations"],
           "activations_checkpointed_bytes": ckpt["activations"] + ckpt["recompute_peak"]}
    for mode in KORTHIKANTI_RECOMPUTE:
        row[f"korthikanti_{mode}_bytes"] = korthikanti_activation_bytes(c, micro_batch, ctx, mode)["total"]
    row["total_bytes"] = plain["total"]
    row["total_checkpointed_bytes"] = states + row["activations_checkpointed_bytes"]
    row["fits"] = row["total_bytes"] <= memory_bytes
    row["fits_checkpointed"] = row["total_checkpointed_bytes"] <= memory_bytes
    return row


def _layouts(world_size: int) -> list[tuple[int, int]]:
    """t × p = world_size 的全部 (t, p)，t 从大到小。"""
    return [(world_size // p, p) for p in range(1, world_size + 1) if world_size % p == 0]


def parallel_rows(model: str | LMConfig, world_size: int = 8, context: int = 4096, micro_batch: int = 1,
                  micro_batches: int = 8, memory_bytes: int = 80 * GB) -> list[dict]:
    """第 12 章：``world_size`` 张卡上每张卡的模型状态字节（混合精度，16 字节/参数；激活不计）。

    * 数据并行 + ZeRO 阶段 0–3：:func:`~tformer_lib.parallel.zero.zero_bytes_per_rank`；阶段 0 一行另列每步
      梯度 all-reduce 的载荷（bf16 梯度 2N 字节）与环形 all-reduce 每卡发出的字节。ZeRO-1/2 的通信量与它相同，
      ZeRO-3 约为 1.5 倍（Rajbhandari et al., 2020 §7），这里只列本书测过的 all-reduce。
    * 张量并行 t × 流水线 p（t·p = ``world_size``）：每卡参数取最重的一段
      （:func:`~tformer_lib.parallel.layout.layout_parameters_per_rank`）；每步（``micro_batches`` 个大小为
      ``micro_batch`` 的微批）张量并行交给 all-reduce 的激活载荷与每卡发出的字节、流水线段边界 send 的字节，
      以及 GPipe 的气泡比例 (p−1)/(m+p−1)。切不开的布局（头数不能被 t 整除、段数多于层数）记在 ``note`` 里。
    """
    name, c = resolve_model(model)
    n = _params(c)["total"]
    ctx = _context(c, context)
    for arg, value in (("world_size", world_size), ("micro_batch", micro_batch), ("micro_batches", micro_batches)):
        positive_int(arg, value)
    rows = []
    for stage in ZERO_STAGES:
        per_gpu = zero_bytes_per_rank(n, world_size, stage, **_MIXED)["total"]
        payload = data_parallel_payload(n, 2) if stage == 0 else None
        rows.append({"name": name, "layout": f"DP×{world_size} ZeRO-{stage}", "context": ctx,
                     "params_per_gpu": n if stage < 3 else n / world_size, "model_states_bytes_per_gpu": per_gpu,
                     "fits": per_gpu <= memory_bytes, "all_reduce_payload_bytes": payload,
                     "sent_per_gpu_bytes": None if payload is None else ring_all_reduce_bytes(payload, world_size),
                     "pipeline_send_bytes": None, "bubble": None, "note": ""})
    for t, p in _layouts(world_size):
        row = {"name": name, "layout": f"TP×{t} PP×{p}", "context": ctx}
        try:
            per_stage = layout_parameters_per_rank(c, t, p)
        except ValueError as error:
            rows.append({**row, "params_per_gpu": None, "model_states_bytes_per_gpu": None, "fits": None,
                         "all_reduce_payload_bytes": None, "sent_per_gpu_bytes": None, "pipeline_send_bytes": None,
                         "bubble": None, "note": str(error)})
            continue
        per_gpu = max(per_stage)
        blocks = max(stop - start for start, stop in split_points(c.n_layers, p))  # 最重一段的块数
        tp = micro_batches * tensor_parallel_payload(micro_batch, ctx, c.d_model, blocks, 2) if t > 1 else 0
        row.update({"params_per_gpu": per_gpu, "model_states_bytes_per_gpu": model_state_bytes(per_gpu, "mixed")["total"],
                    "all_reduce_payload_bytes": tp, "sent_per_gpu_bytes": ring_all_reduce_bytes(tp, t),
                    "pipeline_send_bytes": pipeline_payload(micro_batch * micro_batches, ctx, c.d_model, p, 2) if p > 1 else 0,
                    "bubble": bubble_fraction(p, micro_batches), "note": ""})
        row["fits"] = row["model_states_bytes_per_gpu"] <= memory_bytes
        rows.append(row)
    return rows


def serving_row(model: str | LMConfig, context: int = 4096, memory_bytes: int = 80 * GB,
                accelerators=tuple(ACCELERATORS)) -> dict:
    """第 13 章：``context`` 长的会话，每 ``memory_bytes`` 的 K/V 缓存能容纳几个（fp16 与 int8、模型自己的 K/V 头与
    “假如是 MHA”）、一张卡放下 fp16 权重后还能放几个（放不下记 0）；以及 batch 1 解码一个词元的屋顶线时间
    （fp16 权重与缓存，:func:`~tformer_lib.serving.roofline.decode_cost` 的 FLOPs 与字节，按
    :data:`~tformer_lib.scale.accelerators.ACCELERATORS` 的峰值与带宽；fp16 权重加一个会话的缓存放不进那张卡的
    显存时记 None——单卡根本跑不起来）。``decode_weight_bytes`` 是这一步搬动的字节里权重的那份。"""
    name, c = resolve_model(model)
    n = _params(c)["total"]
    ctx = _context(c, context)
    positive_int("memory_bytes", memory_bytes)
    mha = dataclasses.replace(c, n_kv_heads=None)
    weights = 2 * n  # fp16 权重：每个参数 2 字节
    row = {"name": name, "params": n, "context": ctx, "weights_bytes": weights}
    for label, cfg, e in (("fp16", c, 2), ("fp16_mha", mha, 2), ("int8", c, 1), ("int8_mha", mha, 1)):
        session = ctx * lm_kv_cache_bytes_per_token(cfg, e)
        row[f"kv_{label}_session_bytes"] = session
        row[f"sessions_{label}"] = memory_bytes // session
    row["sessions_fp16_beside_weights"] = max(0, (memory_bytes - weights) // row["kv_fp16_session_bytes"])
    cost = decode_cost(c, 1, ctx, bytes_per_element=2)
    row["decode_flops"], row["decode_bytes"] = cost["flops"], cost["bytes"]
    row["decode_weight_bytes"] = cost["bytes_parts"]["weights"]
    for acc in accelerators:
        if acc not in ACCELERATORS:
            raise ValueError(f"accelerators 里的 {acc!r} 不在 {sorted(ACCELERATORS)} 里")
        spec = ACCELERATORS[acc]
        seconds = cost["flops"] / attainable_flops(cost["intensity"], spec["bf16_flops"], spec["bandwidth"])
        fits = weights + row["kv_fp16_session_bytes"] <= spec["memory_bytes"]
        row[f"decode_ms_{acc}"] = 1e3 * seconds if fits else None
    return row


#: :func:`context_parallel_rows` 里随切分是否可行而为 None 的数值列
_CP_RING = ("ring_saved_bytes", "ring_buffers_bytes", "ring_scores_block_bytes", "ring_sent_per_layer_bytes")
_CP_ULYSSES = ("ulysses_sent_per_layer_bytes", "ulysses_scores_bytes")
_CP_LOCAL = ("tokens_per_gpu", "activations_bytes", "activations_checkpointed_bytes", *_CP_RING, *_CP_ULYSSES,
             "model_states_bytes", "model_states_zero3_bytes", "fits", "fits_checkpointed")


def context_parallel_rows(model: str | LMConfig, context: int = 131072, cp_sizes=(1, 2, 4, 8), micro_batch: int = 1,
                          layout: str = "zigzag", memory_bytes: int = 80 * GB) -> list[dict]:
    r"""第 16 章：``context`` 长的序列切给 cp 张卡做上下文并行（context parallelism, CP），每个 cp（``cp_sizes``）一行，
    数的都是 **每张卡** 的量（bf16 激活，每个元素 2 字节；微批 ``micro_batch`` 条序列）。

    * ``tokens_per_gpu`` = context / cp；``activations_bytes``、``activations_checkpointed_bytes``：本书的激活公式
      :func:`~tformer_lib.measurement.memory.lm_activation_bytes` 在本地长度 T/cp 上的值（快速注意力路径，不重算与重算各一份，
      重算时另加重算一块的峰值，同 :func:`memory_row`）。快速路径只存 q、k、v、输出、拼接与每行的 logsumexp，
      **没有** :math:`(B, h, T, T)` 的项，所以激活与 T 成正比：cp 张卡每张正好是 1/cp（只差损失里一个 4 字节的标量）。
      每张卡上除注意力以外的张量本来就只涉及自己的词元；注意力由环形注意力或 Ulysses 接手，存的同样只是本地那片。
    * 环形注意力（:mod:`~tformer_lib.parallel.ring_attention`，按 ``layout`` 切序列）：``ring_saved_bytes`` 是各层的
      ``RingAttention`` 为反向存下的 q、k、v、输出与 logsumexp（:func:`~tformer_lib.parallel.ring_attention.ring_attention_saved_bytes`
      × 层数；它取代激活列里快速路径存的 q、k、v、输出与 logsumexp，不另加——MHA 时比那份略小（logsumexp 存成 bf16），
      GQA 时更大（K/V 复制到 h 个头，见下），激活列按快速路径算，不含这点差别）；``ring_buffers_bytes`` 是它 **多出来** 的：
      反向时一层同时在手的 K、V、dK、dV 四块加上 ``_pass_to_next`` 为它们开的四个接收缓冲，共 8 块
      :math:`B\,h\,(T/cp)\,d_k` ——一次只有一层在跑，不乘层数，前向只有其一半；``ring_sent_per_layer_bytes``：每层每步
      （一次前向 + 一次反向）每张卡发出的字节，即 :func:`~tformer_lib.parallel.ring_attention.ring_attention_payload`
      的两项之和（打开激活重算时前向再算一遍，前向那份再传一次，这里不加）。
    * Ulysses（:mod:`~tformer_lib.parallel.ulysses`，按顺序切）：``ulysses_sent_per_layer_bytes`` 是每层每步交给
      all-to-all 的字节（:func:`~tformer_lib.parallel.ulysses.ulysses_payload` 前向、反向之和，含留给自己的 1/cp）。
      它按头分给各卡，cp 须整除头数 h；不能整除时这两列记 None、原因记在 ``note`` 里。
    * 本书的两种实现都要求 q、k、v 头数相同：GQA 的模型先把 K/V 头复制到 h 个，上面的字节都按 h 个头算
      （只传 h_kv 个头的实现，环上的字节按 h_kv/h 缩小）。它们每个进程内的注意力是显式的：环形注意力每一步
      算出一块 ``(B, h, T/cp, T/cp)`` 的分数（``ring_scores_block_bytes``，一块，临时），Ulysses 在整条序列上
      算 ``(B, h/cp, T, T)``（``ulysses_scores_bytes``，一份）。真实系统在这里用融合内核（FlashAttention），
      这两项就没有了；``fits`` 按融合内核算，不计它们。
    * 模型状态不属于上下文并行：CP 的每张卡都持有整份权重。``model_states_bytes`` 是混合精度 + AdamW 的整份
      （16 字节/参数）；``model_states_zero3_bytes`` 是把它们用 ZeRO-3 分到这 cp 张卡上的每卡份额 16N/cp
      （:func:`~tformer_lib.parallel.zero.zero_bytes_per_rank`；取回一层参数的临时量不计）。
      ``fits`` / ``fits_checkpointed``：激活（不重算 / 重算）+ ``ring_buffers_bytes`` + ``model_states_zero3_bytes``
      ≤ ``memory_bytes``。

    长度按所给的 ``context`` 算，**不** 截断到模型的 ``max_len``：``beyond_max_len`` 为真时，模型本身跑不了这么长
    （:class:`~tformer_lib.lm.DecoderOnlyLM` 拒绝超过 ``max_len`` 的输入），要先放大 ``max_len``——RoPE 的模型配上
    RoPE 缩放（``rope_scaling``）并继续训练；可学习位置嵌入的模型没有更多的位置——``note`` 里写明。字节只依赖长度，
    与 ``max_len`` 无关。切不开的情形也记在 ``note`` 里，不抛错：context 不能被 cp 整除时这一行的数都是 None；
    能被 cp 但不能被 ``layout`` 要的块数（之字形 2·cp）整除时，环形注意力的四列是 None（``fits`` 不计它的缓冲）。
    ALiBi 的模型不收：它每层的偏置是 ``(h, T, T)``，本书的激活公式不含这一项。
    """
    name, c = resolve_model(model)
    positive_int("context", context)
    sizes = positive_ints("cp_sizes", cp_sizes)
    positive_int("micro_batch", micro_batch)
    one_of("layout", layout, LAYOUTS)
    positive_int("memory_bytes", memory_bytes)
    if c.positional == "alibi":
        raise ValueError(f"{name} 用 ALiBi：每层的 (h, T, T) 偏置不在 lm_activation_bytes 的公式里，第 16 章的账本不收")
    fast = dataclasses.replace(c, fast_attention=True)
    n = _params(c)["total"]
    e, B, h, d = 2, micro_batch, c.n_heads, c.d_k
    model_notes = []
    if context > c.max_len:
        if c.positional == "learned":
            model_notes.append(f"可学习位置嵌入只有 max_len={c.max_len} 个位置：这个模型跑不了 {context} 长的输入，"
                               f"这一行只是公式外推")
        else:
            fix = "、配上 RoPE 缩放（rope_scaling）" if c.positional == "rope" else ""
            model_notes.append(f"context={context} 超过训练长度 max_len={c.max_len}：要先放大 max_len{fix}并继续训练")
    rows = []
    for cp in sizes:
        row = {"name": name, "context": context, "max_len": c.max_len, "beyond_max_len": context > c.max_len,
               "cp": cp, "layout": layout, "micro_batch": micro_batch}
        notes = list(model_notes)
        if context % cp:
            notes.append(f"context={context} 不能被 cp={cp} 整除：序列切不开")
            rows.append({**row, **dict.fromkeys(_CP_LOCAL), "note": "；".join(notes)})
            continue
        local = context // cp
        plain = lm_activation_bytes(fast, B, local, e)
        ckpt = lm_activation_bytes(fast, B, local, e, checkpointing=True)
        row.update({"tokens_per_gpu": local, "activations_bytes": plain["total"],
                    "activations_checkpointed_bytes": ckpt["total"] + ckpt["recompute_peak"]})
        pieces = cp if layout == "contiguous" else 2 * cp
        if context % pieces:
            notes.append(f"layout={layout!r} 要把序列切成 {pieces} 块，context={context} 不能被它整除：环形注意力切不开")
            row.update(dict.fromkeys(_CP_RING))
        else:
            block = B * h * local * d * e  # 环上传的一块 K（或 V、dK、dV）
            sent = ring_attention_payload(B, h, local, d, cp, e)
            row.update({"ring_saved_bytes": c.n_layers * ring_attention_saved_bytes(B, h, local, d, e),
                        "ring_buffers_bytes": 8 * block if cp > 1 else 0,
                        "ring_scores_block_bytes": B * h * local * local * e,
                        "ring_sent_per_layer_bytes": sent["forward"] + sent["backward"]})
        if h % cp:
            notes.append(f"头数 h={h} 不能被 cp={cp} 整除：Ulysses 按头分给各卡，分不开")
            row.update(dict.fromkeys(_CP_ULYSSES))
        else:
            a2a = ulysses_payload(B, h, local, d, e)
            row.update({"ulysses_sent_per_layer_bytes": a2a["forward"] + a2a["backward"] if cp > 1 else 0,
                        "ulysses_scores_bytes": B * (h // cp) * context * context * e})
        states = model_state_bytes(n, "mixed")["total"]
        zero3 = zero_bytes_per_rank(n, cp, 3, **_MIXED)["total"]
        transient = row["ring_buffers_bytes"] or 0
        row.update({"model_states_bytes": states, "model_states_zero3_bytes": zero3,
                    "fits": row["activations_bytes"] + transient + zero3 <= memory_bytes,
                    "fits_checkpointed": row["activations_checkpointed_bytes"] + transient + zero3 <= memory_bytes,
                    "note": "；".join(notes)})
        rows.append(row)
    return rows
