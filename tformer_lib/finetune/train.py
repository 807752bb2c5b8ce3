"""在一位诗人的诗上微调随书唐诗模型：全量微调（full）、LoRA 或 QLoRA，同一个训练循环（:class:`~tformer_lib.lm.LMTrainer`）。

三种方法只差“哪些参数要梯度、底座是什么格式”：

* ``"full"``：全部参数都训练；
* ``"lora"``：底座冻结，:data:`FINETUNE_RECIPE` 的 ``targets`` 里每个线性层加一条秩 r 的支路（α = 2r）；
* ``"qlora"``：同 LoRA，但底座的线性层先量化成 int4（组大小 64）。

学习率由 ``python -m tformer_lib.finetune.measure`` 在目标诗人的 valid 诗上从几个候选里选出（结果文件里有记录），
报告的数字都在 test 上。
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .._checks import one_of, positive_int
from ..lm.quality import lm_perplexity
from ..lm.training import LMTrainer
from .lora import apply_lora
from .memory import FINETUNE_METHODS
from .qlora import apply_qlora

__all__ = ["FINETUNE_RECIPE", "prepare_finetune", "finetune_poet", "finetune_scores"]

#: 微调的配方：60 步 × 16 块 × 128 个目标 ≈ 12 万个目标词元，杜甫的 842 首诗（约 5.2 万词元）约过 2.4 遍
FINETUNE_RECIPE = {
    "author": "杜甫",
    "steps": 60,
    "batch_size": 16,
    "warmup": 10,
    "min_lr_ratio": 0.1,
    "weight_decay": 0.0,
    "clip": 1.0,
    "lr": {"full": 1e-3, "lora": 2e-3, "qlora": 2e-3},  # 在 target_valid 上选出（见 finetune.json 的 lr_sweep）
    "alpha_per_rank": 2,  # α = 2r：缩放 α/r = 2，换秩时不必重调学习率
    "targets": ("w_q", "w_k", "w_v", "w_o", "w_1", "w_2"),
    "qlora_format": "int4-g64",
}


def prepare_finetune(base: nn.Module, method: str, rank: int | None = None, *, seed: int = 0,
                     recipe: dict = FINETUNE_RECIPE) -> nn.Module:
    """``base`` 的一份副本（``base`` 不变），按 ``method`` 准备好要训练的参数；LoRA 支路的初始 A 由 ``seed`` 决定。"""
    one_of("method", method, FINETUNE_METHODS)
    if not isinstance(base, nn.Module):
        raise TypeError(f"base 应是 nn.Module（如随书唐诗模型），收到 {type(base).__name__}")
    if method == "full":
        if rank is not None:
            raise ValueError(f"全量微调没有秩：rank 应为 None，收到 {rank!r}")
        return copy.deepcopy(base).float().train()
    positive_int("rank", rank)
    model = copy.deepcopy(base).float().train()
    torch.manual_seed(seed)  # A 的初始化（kaiming_uniform）；B = 0
    alpha = recipe["alpha_per_rank"] * rank
    if method == "lora":
        return apply_lora(model, rank, alpha, targets=recipe["targets"])
    return apply_qlora(model, rank, alpha, targets=recipe["targets"], fmt=recipe["qlora_format"])


def finetune_poet(base: nn.Module, data: dict, method: str = "lora", rank: int | None = 16, *, seed: int = 0,
                  lr: float | None = None, steps: int | None = None, recipe: dict = FINETUNE_RECIPE):
    """按配方微调 ``base`` 的副本，返回 ``(model, trainer)``（模型处于 eval 模式）。

    ``data`` 来自 :func:`~tformer_lib.finetune.poet.poet_data`；``lr``、``steps`` 不给时用配方里的值；
    ``seed`` 决定数据顺序与支路的初始化。全量微调时 ``rank`` 必须是 None。
    """
    if not isinstance(data, dict) or "train_blocks" not in data:
        raise TypeError("data 应是 poet_data(tokenizer, author) 返回的字典（含 train_blocks）")
    model = prepare_finetune(base, method, None if method == "full" else rank, seed=seed, recipe=recipe)
    steps = recipe["steps"] if steps is None else positive_int("steps", steps)
    trainer = LMTrainer(
        model, data["train_blocks"], None, batch_size=recipe["batch_size"],
        lr=recipe["lr"][method] if lr is None else lr, warmup=min(recipe["warmup"], steps), total_steps=steps,
        min_lr_ratio=recipe["min_lr_ratio"], weight_decay=recipe["weight_decay"], clip=recipe["clip"], seed=seed,
        eval_every=steps, progress=False,
    )
    trainer.fit()
    return model.eval(), trainer


def finetune_scores(model: nn.Module, data: dict, splits=("target_valid", "target_test", "others_test")) -> dict[str, float]:
    """每组诗上的困惑度（:func:`~tformer_lib.lm.lm_perplexity`），键与 ``splits`` 相同。"""
    return {name: lm_perplexity(model, *data[name])[1] for name in splits}
