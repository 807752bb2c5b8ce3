"""第 17 章（微调：SFT 与 LoRA）的练习检查器，和“找错”题里那个初始化错了的 LoRA 支路。

- :func:`check_lora_parameter_count`（推导并核对）：一个仅解码器模型加 LoRA 后有多少个可训练参数——与真的
  :func:`~tformer_lib.finetune.apply_lora` 之后数出来的比较（含 GQA：W^K、W^V 比 d_model 窄）；
- :func:`buggy_lora_branch` + :func:`check_lora_branch`（找错）：B 没有初始化成 0，刚加上的适配器就改变了模型；
- :func:`check_multi_lora_delta`（实现）：多适配器服务的核心——每个词元只加上它自己那个适配器的增量，-1 的词元不加；
- :func:`check_lora_state_bytes`（推导并核对）：LoRA 微调时权重、梯度与 Adam 状态一共占多少字节，与
  :func:`~tformer_lib.finetune.finetune_memory` 比较（包括 LLaMA-2-7B 的 bf16 底座）。

每个检查器都在多组随机情形上调用读者的函数，桩（stub）→ “⏳ 尚未完成”，不抛异常。
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from tformer_lib.exercises._core import (
    CheckResult,
    Mistake,
    Variant,
    as_int,
    compare,
    compare_number,
    draw_choice,
    draw_int,
    random_cases,
    run_checks,
)

__all__ = ["check_lora_parameter_count", "buggy_lora_branch", "check_lora_branch", "check_multi_lora_delta",
           "check_lora_state_bytes"]

_ALL = ("w_q", "w_k", "w_v", "w_o", "w_1", "w_2")


# ---- 推导并核对：LoRA 的可训练参数 -------------------------------------------------------------------------


def _counted(d_model: int, n_heads: int, n_kv_heads: int, d_ff: int, n_layers: int, rank: int, targets) -> int:
    """造一个真的小模型、加上 LoRA，数要求梯度的参数。"""
    from tformer_lib.finetune import apply_lora, trainable_parameters
    from tformer_lib.lm import LMConfig, make_lm

    config = LMConfig(vocab_size=8, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, n_layers=n_layers,
                      d_ff=d_ff, max_len=4, positional="learned", norm="rms", activation="gelu", norm_first=True)
    return trainable_parameters(apply_lora(make_lm(config), rank, 2 * rank, targets=tuple(targets)))


def check_lora_parameter_count(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(d_model, n_heads, n_kv_heads, d_ff, n_layers, rank, targets) -> int``：给仅解码器模型每块里名字在
    ``targets`` 中的线性层（``w_q``、``w_k``、``w_v``、``w_o``、``w_1``、``w_2``；前馈是 GELU，W_1: d→d_ff，W_2: d_ff→d）
    各加一条秩 ``rank`` 的 LoRA 支路之后，可训练参数一共多少个。K/V 头数是 ``n_kv_heads``（GQA）。"""

    def shapes(f):
        for i, g in enumerate(random_cases(8, seed=171)):
            if i == 0:  # LLaMA-2-7B 的注意力与层数（前馈换成 GELU 的 d_ff），W^Q 与 W^V、r = 16
                d, h, kv, d_ff, n, r, targets = 4096, 32, 32, 11008, 32, 16, ("w_q", "w_v")
                want = n * r * ((d + d) + (d + kv * d // h))
            else:
                h = draw_choice(g, (2, 4, 8))
                kv = draw_choice(g, [k for k in (1, 2, 4, 8) if h % k == 0])
                d, d_ff, n, r = h * draw_int(g, 2, 8), draw_int(g, 4, 64), draw_int(g, 1, 3), draw_int(g, 1, 8)
                targets = tuple(t for t in _ALL if draw_int(g, 0, 1)) or ("w_v",)
                if i == 1:
                    targets, kv = ("w_k", "w_v"), 1  # 多查询注意力：W^K、W^V 只投影到 d_k 维
                want = _counted(d, h, kv, d_ff, n, r, targets)
            call = f"lora_parameter_count(d_model={d}, n_heads={h}, n_kv_heads={kv}, d_ff={d_ff}, n_layers={n}, rank={r}, targets={targets})"
            kv_dim = kv * d // h
            dims = {"w_q": (d, d), "w_k": (kv_dim, d), "w_v": (kv_dim, d), "w_o": (d, d), "w_1": (d_ff, d), "w_2": (d, d_ff)}
            no_gqa = {**dims, "w_k": (d, d), "w_v": (d, d)}
            variants = [
                Variant("full_matrix", "LoRA 训练的是两个窄矩阵 A (r, in) 与 B (out, r)，不是 r·in·out",
                        n * sum(r * dims[t][0] * dims[t][1] for t in targets)),
                Variant("one_layer", "每一块都有这些线性层：乘以 n_layers", sum(r * (dims[t][0] + dims[t][1]) for t in targets)),
                Variant("no_gqa", "n_kv_heads < n_heads 时 W^K、W^V 的输出只有 n_kv_heads·d_k = n_kv_heads·d_model/n_heads 维",
                        n * sum(r * (no_gqa[t][0] + no_gqa[t][1]) for t in targets)),
                Variant("only_a", "每条支路有两个矩阵：A 是 r·in 个，B 是 out·r 个", n * sum(r * dims[t][1] for t in targets)),
                Variant("rank_squared", "A (r, in) 与 B (out, r) 合计 r·(in + out) 个，不是 r²",
                        n * sum(r * r for _ in targets)),
            ]
            variants = [Variant(v.key, f"{call} 应为 {want}。{v.hint}", v.value) for v in variants if v.value != want]
            compare_number(as_int(f(d, h, kv, d_ff, n, r, targets), f"{call} 的返回值"), want, variants=variants,
                           what=f"{call} 的返回值", rtol=0, atol=0,
                           default_hint=f"{call} 应为 {want}：每个目标层 r·(in + out) 个，再乘以层数")

    from tformer_lib.finetune import LoRALinear, apply_lora, lora_parameter_count, trainable_parameters

    return run_checks("LoRA 的可训练参数", fn, [("8 组随机的模型形状、秩与目标层（含 GQA、MQA 与 LLaMA-2-7B 的大小）", shapes)],
                      verbose=verbose, forbidden=(lora_parameter_count, trainable_parameters, apply_lora, LoRALinear))


# ---- 找错：LoRA 支路的初始化 ---------------------------------------------------------------------------------


def buggy_lora_branch(in_features: int, out_features: int, rank: int, generator: torch.Generator | None = None):
    """一个初始化错了的 LoRA 支路（找错练习用，不要在别处使用）：返回 ``(A (rank, in), B (out, rank))``。"""
    bound = 1 / math.sqrt(in_features)
    lora_A = (torch.rand(rank, in_features, generator=generator) * 2 - 1) * bound  # 与 kaiming_uniform(a=√5) 同分布
    lora_B = torch.randn(out_features, rank, generator=generator) * 0.02  # 小一点的随机数
    return lora_A, lora_B


def check_lora_branch(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查改好的 ``fn(in_features, out_features, rank, generator) -> (A, B)``：``A`` ``(rank, in)``、``B`` ``(out, rank)``，
    都是 float32；刚加上的支路不改变模型（B A = 0），而且第一步就有梯度能让它学起来；A 的尺度与 ``nn.Linear``
    的初始化相当（均匀分布在 ±1/√in 内）。"""

    def branches(f):
        for i, g in enumerate(random_cases(6, seed=172)):
            n_in, n_out, r = draw_int(g, 8, 200), draw_int(g, 8, 200), draw_choice(g, (1, 2, 4, 8, 16))
            call = f"lora_branch({n_in}, {n_out}, {r}, generator)"
            got = f(n_in, n_out, r, torch.Generator().manual_seed(i))
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise Mistake(f"{call}：应返回两个张量 (A, B)，你返回的是 {type(got).__name__}", key="type")
            lora_A, lora_B = got
            for name, t, shape in (("A", lora_A, (r, n_in)), ("B", lora_B, (n_out, r))):
                if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
                    raise Mistake(f"{call}：{name} 应是浮点张量，你的是 {type(t).__name__}", key="type")
                if tuple(t.shape) != shape:
                    raise Mistake(f"{call}：{name} 的形状应为 {shape}，你的是 {tuple(t.shape)}"
                                  "（A 把 in 维压到 r 维，B 再从 r 维升到 out 维）", key="shape")
            x = torch.randn(5, n_in, generator=g)
            delta = x @ lora_A.T.float() @ lora_B.T.float()  # (5, out)：支路加在底座输出上的量
            a_zero, b_zero = not bool(lora_A.any()), not bool(lora_B.any())
            if a_zero and b_zero:
                raise Mistake(f"{call}：A 与 B 都是 0。刚加上时模型确实不变，但 ∂L/∂B = g·(A x)ᵀ = 0、∂L/∂A = Bᵀ g xᵀ = 0："
                              "两个矩阵都没有梯度，训练永远不会开始。只让 B = 0，A 用随机数", key="both_zero")
            if a_zero:
                raise Mistake(f"{call}：A 是 0、B 是随机数。B A = 0，模型一开始也不变，A 的梯度 Bᵀ g xᵀ 也不为 0——"
                              "这样也能训练，但与 LoRA 论文、peft 和本章的约定相反（B = 0，A 随机）：适配器文件与 peft 对不上",
                              key="swapped")
            if not b_zero:
                raise Mistake(f"{call}：B 不是 0，刚加上的适配器就让线性层的输出偏了 "
                              f"{float(delta.abs().max()):.3g}（最大绝对值）：微调不是从原模型出发，而是从一个被随机扰动过的模型出发。"
                              "LoRA 的约定是 B = 0（B A = 0，起点与原模型逐位相同），A 用随机数", key="b_not_zero")
            bound = 1 / math.sqrt(n_in)
            if float(lora_A.abs().max()) > 1.001 * bound or float(lora_A.std()) < 0.2 * bound:
                raise Mistake(f"{call}：A 的尺度不对（最大绝对值 {float(lora_A.abs().max()):.3g}、标准差 {float(lora_A.std()):.3g}）。"
                              f"与 nn.Linear 一样用 kaiming_uniform_(a=√5)：均匀分布在 ±1/√in = ±{bound:.3g} 内", key="a_scale")

    return run_checks("LoRA 支路的初始化", fn, [("6 组随机的形状与秩", branches)], verbose=verbose)


# ---- 实现：多适配器的增量 ------------------------------------------------------------------------------------


def _reference_delta(x: torch.Tensor, ids: torch.Tensor, adapters) -> torch.Tensor:
    out = torch.zeros(x.shape[0], adapters[0][1].shape[0], dtype=torch.float64)
    for n in range(x.shape[0]):
        i = int(ids[n])
        if i >= 0:
            lora_A, lora_B, scaling = adapters[i]
            out[n] = scaling * (lora_B.double() @ (lora_A.double() @ x[n].double()))
    return out


def check_multi_lora_delta(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(x, ids, adapters) -> delta``：``x`` ``(N, in)`` 是一批词元的输入，``ids`` ``(N,)`` 是每个词元的适配器编号
    （-1 = 只用底座），``adapters`` 是 ``[(A_i (r_i, in), B_i (out, r_i), scaling_i), …]``（各适配器的秩可以不同）；
    返回 ``(N, out)``：第 n 行是 ``scaling_i · B_i A_i x_n``（i = ids[n]），ids[n] = -1 的行是 0。"""

    def batches(f):
        for i, g in enumerate(random_cases(6, seed=173)):
            n_in, n_out, k = draw_int(g, 3, 24), draw_int(g, 3, 24), draw_int(g, 1, 4)
            adapters = []
            for _ in range(k):
                r = draw_int(g, 1, 6)
                adapters.append((torch.randn(r, n_in, generator=g), torch.randn(n_out, r, generator=g),
                                 float(draw_choice(g, (0.5, 1.0, 2.0, 4.0)))))
            n = draw_int(g, 2, 20)
            ids = torch.randint(-1, k, (n,), generator=g)
            ids[0], ids[-1] = -1, k - 1
            x = torch.randn(n, n_in, generator=g)
            want = _reference_delta(x, ids, adapters)
            call = f"{n} 个词元、{k} 个适配器（秩 {[a[0].shape[0] for a in adapters]}）"
            got = f(x.clone(), ids.clone(), [(a.clone(), b.clone(), s) for a, b, s in adapters])
            wrap = ids.clone()
            wrap[wrap < 0] = k - 1  # Python 的负下标：-1 取到最后一个适配器
            variants = [
                Variant("negative_index", f"{call}：ids = -1 的词元也加上了最后一个适配器的增量——adapters[-1] 在 Python 里"
                        "是最后一个，不是“没有适配器”。先挑出 ids == i 的行，再只给它们加", _reference_delta(x, wrap, adapters)),
                Variant("no_scaling", f"{call}：忘了乘缩放 α/r（每个适配器自己的 scaling）",
                        _reference_delta(x, ids, [(a, b, 1.0) for a, b, _ in adapters])),
                Variant("first_adapter", f"{call}：每个词元都用了第 0 个适配器：要按 ids 挑",
                        _reference_delta(x, torch.where(ids >= 0, torch.zeros_like(ids), ids), adapters)),
            ]
            compare(got, want, variants=[v for v in variants if not torch.allclose(v.value, want)],
                    what=f"{call}的增量 delta", atol=1e-4, rtol=1e-4,
                    default_hint=f"{call}：第 n 行应是 scaling_i · (x_n A_iᵀ) B_iᵀ，i = ids[n]；ids[n] = -1 的行全是 0")

    from tformer_lib.finetune import AdapterSet, MultiLoRALinear

    return run_checks("多适配器的增量", fn, [("6 组随机的批（含 -1 的词元与秩不同的适配器）", batches)],
                      verbose=verbose, forbidden=(AdapterSet, MultiLoRALinear))


# ---- 推导并核对：LoRA 微调的模型状态字节 -------------------------------------------------------------------


def check_lora_state_bytes(fn: Callable[..., Any], *, verbose: bool = True) -> CheckResult:
    """检查 ``fn(frozen_params, base_bytes, trainable_params) -> int``：冻结的底座有 ``frozen_params`` 个参数、每个
    ``base_bytes`` 字节（float32 为 4，bf16 为 2），LoRA 支路有 ``trainable_params`` 个 float32 参数、用 Adam 训练时，
    权重 + 梯度 + Adam 状态（m 与 v）一共占多少字节（激活不算）。"""

    def sizes(f):
        from tformer_lib.finetune import finetune_memory, lora_parameter_count
        from tformer_lib.lm import PRESETS
        from tformer_lib.quant.sizes import parameter_count

        cases = [("llama-2-7b", 2, 16, ("w_q", "w_v")), ("llama-2-70b", 2, 64, _ALL)]
        for g in random_cases(4, seed=174):
            cases.append((draw_choice(g, ("gpt2", "qwen2.5-0.5b", "mistral-7b")), draw_choice(g, (2, 4)),
                          draw_choice(g, (4, 8, 32)), draw_choice(g, (("w_q", "w_v"), _ALL))))
        for name, base_bytes, r, targets in cases:
            c = PRESETS[name]
            frozen, trainable = parameter_count(c), lora_parameter_count(c, r, targets)
            memory = finetune_memory(c, "lora", batch=1, length=1, rank=r, targets=targets,
                                     base_format="bf16" if base_bytes == 2 else "fp32")
            want = memory["weights"] + memory["grads"] + memory["adam"]
            call = f"lora_state_bytes({frozen}, {base_bytes}, {trainable})（{name}，r = {r}）"
            variants = [
                Variant("grads_for_frozen", "冻结的参数不要梯度：只有支路的参数有 .grad", want + 4 * frozen),
                Variant("adam_for_frozen", "优化器只拿到要求梯度的参数：冻结的底座没有 Adam 状态", want + 4 * frozen + 8 * frozen),
                Variant("full_finetune", "那是全量微调的 16 字节/参数；LoRA 的底座只占权重本身", 16 * (frozen + trainable)),
                Variant("twelve_per_trainable", "支路每个参数 16 字节：权重本身 4、梯度 4、Adam 的 m 与 v 各 4"
                        "（少了的那 4 字节，要么是支路的权重本身，要么是 Adam 的一份矩）", frozen * base_bytes + 12 * trainable),
                Variant("bits", "算出来的是位数：题目要字节", 8 * want),
            ]
            variants = [Variant(v.key, f"{call} 应为 {want:,} 字节。{v.hint}", v.value) for v in variants if v.value != want]
            compare_number(as_int(f(frozen, base_bytes, trainable), f"{call} 的返回值"), want, variants=variants,
                           what=f"{call} 的返回值", rtol=0, atol=0,
                           default_hint=f"{call} 应为 {want:,}：底座只有权重（每个 base_bytes 字节），支路每个参数 "
                                        "4（权重）+ 4（梯度）+ 8（m 与 v）字节")

    from tformer_lib.finetune import finetune_memory
    from tformer_lib.measurement.memory import model_state_bytes

    return run_checks("LoRA 微调的模型状态字节", fn, [("LLaMA-2-7B/70B 与 4 个随机的真实模型、秩与目标层", sizes)],
                      verbose=verbose, forbidden=(finetune_memory, model_state_bytes))
