r"""LoRA（low-rank adaptation，低秩适配）：冻结的 ``nn.Linear`` 旁边加一条低秩的支路，只训练这条支路。

一个 ``(out, in)`` 的线性层 :math:`y = W x + b`，LoRA 把它换成

.. math::

    y = W x + b + \frac{\alpha}{r}\, B A x,\qquad A \in \mathbb{R}^{r \times \text{in}},\ B \in \mathbb{R}^{\text{out} \times r},

:math:`W`、:math:`b` 冻结不动，只有 :math:`A`、:math:`B` 求梯度：可训练参数从 out·in 个降到 r·(in + out) 个。
初始化与 peft 的默认相同：:math:`A` 用 ``kaiming_uniform_(a=√5)``（与 ``nn.Linear`` 的权重一样），:math:`B = 0`——
所以刚加上 LoRA 的模型与原模型**逐位相同**，训练从原模型出发。缩放 :math:`\alpha / r` 让改变秩时不必重调学习率。

训练完可以把支路**合并**进权重：:math:`W \leftarrow W + \frac{\alpha}{r} B A`，之后的前向与普通线性层一样快（:meth:`LoRALinear.merge`，
:func:`merge_lora`）；:meth:`LoRALinear.unmerge` 减回去。与 peft 的 ``get_peft_model`` / ``merge_and_unload`` 逐项对照见测试。

``base`` 也可以是第 14 章量化过的层（:class:`~tformer_lib.quant.Int8Linear`、:class:`~tformer_lib.quant.Int4Linear`）：
这就是 QLoRA 的思路（:mod:`~tformer_lib.finetune.qlora`）——冻结的整数底座，浮点的支路。
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from .._checks import dropout_rate, positive_int
from ..quant.linear import Int4Linear, Int8Linear

#: 能作 LoRA 底座的层：普通线性层，或第 14 章的只量化权重的线性层（QLoRA）
QUANTIZED_BASES = (Int8Linear, Int4Linear)

__all__ = ["LoRALinear", "apply_lora", "merge_lora", "lora_state_dict", "trainable_parameters", "QUANTIZED_BASES"]


def check_lora_hyperparameters(rank, alpha, dropout) -> float:
    """检查秩、α 与 dropout（返回 dropout 的概率）；出错时指名哪个参数、收到什么。"""
    positive_int("rank", rank)
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha 应是数，收到 {type(alpha).__name__} {alpha!r}")
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha 应是有限的正数（缩放是 alpha / rank），收到 {alpha!r}")
    return dropout_rate("dropout", dropout)


class LoRALinear(nn.Module):
    """冻结的 ``base``（``nn.Linear``）加一条秩为 ``rank`` 的支路：``y = base(x) + (alpha / rank) · B A dropout(x)``。

    ``lora_A`` ``(rank, in)``、``lora_B`` ``(out, rank)`` 是仅有的可训练参数；``merged`` 为 True 时支路已并进
    ``base.weight``，前向只算 ``base``。
    """

    def __init__(self, base: nn.Module, rank: int, alpha: float, dropout: float = 0.0):
        super().__init__()
        # 子类（如 MultiheadAttention 的 out_proj）的父模块会直接读 .weight：不替换
        if type(base) is not nn.Linear and not isinstance(base, QUANTIZED_BASES):
            raise TypeError(f"base 应是 nn.Linear（不是它的子类）或 Int8Linear/Int4Linear，收到 {type(base).__name__}")
        if isinstance(base.weight if type(base) is nn.Linear else None, nn.parameter.UninitializedParameter):
            raise TypeError("base 的权重还没初始化（LazyLinear）：先跑一次前向，再加 LoRA")
        dropout_p = check_lora_hyperparameters(rank, alpha, dropout)
        self.base, self.rank, self.alpha = base, rank, float(alpha)
        self.scaling = self.alpha / rank
        for p in base.parameters():
            p.requires_grad_(False)  # 原来的权重冻结
        reference = base.weight if type(base) is nn.Linear else base.scale  # 量化层：支路用比例因子的浮点类型
        factory = dict(dtype=reference.dtype, device=reference.device)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **factory))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **factory))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # 与 nn.Linear 和 peft 相同；B = 0：起点就是原模型
        self.dropout = nn.Dropout(dropout_p) if dropout_p > 0 else nn.Identity()  # p = 0 的 Dropout 在训练模式下仍会复制一份 x
        self.merged = False
        self.train(base.training)  # 与被替换的层同一个模式（eval 的模型里不会冒出随机的 dropout）

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def delta_weight(self) -> torch.Tensor:
        """支路等价的权重增量 ``(alpha / rank) · B A`` ``(out, in)``。"""
        return self.scaling * (self.lora_B @ self.lora_A)  # (out, in)

    @property
    def quantized(self) -> bool:
        """底座是量化层（QLoRA）：不能原地合并，见 :func:`merge_lora`。"""
        return isinstance(self.base, QUANTIZED_BASES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # (..., out)
        if self.merged:
            return y
        return y + self.scaling * (self.dropout(x) @ self.lora_A.T @ self.lora_B.T)  # (..., in) → (..., r) → (..., out)

    @torch.no_grad()
    def merge(self) -> "LoRALinear":
        """把支路并进 ``base.weight``（部署用：之后的前向与普通线性层一样）。已合并时什么也不做。"""
        if self.quantized:
            raise TypeError(f"底座是 {type(self.base).__name__}：整数权重加不进浮点的增量；"
                            "merge_lora(model) 会先把它反量化成 nn.Linear 再合并")
        if not self.merged:
            self.base.weight += self.delta_weight()
            self.merged = True
        return self

    @torch.no_grad()
    def unmerge(self) -> "LoRALinear":
        """:meth:`merge` 的逆：从 ``base.weight`` 里减回支路（浮点舍入之内还原）。未合并时什么也不做。"""
        if self.merged:
            self.base.weight -= self.delta_weight()
            self.merged = False
        return self

    def get_extra_state(self) -> dict:
        """``merged`` 也存进 ``state_dict``：合并过的权重读进一个新的、未合并的模型时不会被再加一遍支路。"""
        return {"merged": self.merged}

    def set_extra_state(self, state: dict) -> None:
        self.merged = bool(state["merged"])

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}, merged={self.merged}"

    @torch.no_grad()
    def dequantize_base(self) -> "LoRALinear":
        """把量化的底座换成同样取值的 ``nn.Linear``（``Ŵ`` 与偏置，冻结）；底座本来就是浮点时什么也不做。"""
        if self.quantized:
            weight = self.base.dequantized_weight(self.lora_A.dtype)  # (out, in)
            linear = nn.Linear(self.in_features, self.out_features, bias=self.base.bias is not None,
                               dtype=weight.dtype, device=weight.device)
            linear.weight.copy_(weight)
            if self.base.bias is not None:
                linear.bias.copy_(self.base.bias)
            self.base = linear.requires_grad_(False).train(self.training)
        return self


def check_model(model) -> None:
    """``model`` 应是 ``nn.Module``。"""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model 应是 nn.Module，收到 {type(model).__name__}")


def check_targets(targets) -> tuple[str, ...]:
    """``targets`` 应是线性层属性名组成的非空列表或元组（如 ``('w_q', 'w_v')``）；返回元组。

    生成器、迭代器一类只能读一遍的对象也拒绝：读过一遍检查之后就空了，什么层都匹配不上。"""
    if not isinstance(targets, (list, tuple)) or not targets or not all(isinstance(t, str) for t in targets):
        raise TypeError(f"targets 应是线性层属性名组成的非空列表或元组（如 ('w_q', 'w_v')），收到 {targets!r}")
    return tuple(targets)


def check_no_lora(model: nn.Module) -> None:
    """``model`` 里还没有 LoRA 支路（:class:`LoRALinear`）。"""
    if any(isinstance(m, LoRALinear) for m in model.modules()):
        raise ValueError("model 已经加过 LoRA：先 merge_lora(model)，或从原来的模型开始")


def find_targets(model: nn.Module, targets) -> list[tuple[nn.Module, str, nn.Module]]:
    """``targets`` 指到的每个线性层 ``(父模块, 属性名, 线性层)``；同一个层经两条路径都能到达时，两条都列出
    （之后换成同一个 LoRALinear）。名字不存在、是 ``nn.Linear`` 的子类或权重与别的模块共享时报错。"""
    targets = check_targets(targets)
    found = [(parent, name, child) for parent in model.modules() for name, child in parent._modules.items()
             if name in targets and isinstance(child, (nn.Linear, *QUANTIZED_BASES))]
    subclass = sorted({f"{name}（{type(child).__name__}）" for _, name, child in found
                       if isinstance(child, nn.Linear) and type(child) is not nn.Linear})
    if subclass:
        raise TypeError(f"这些目标是 nn.Linear 的子类，它们的父模块会直接读 .weight，换成 LoRA 后前向会出错：{'、'.join(subclass)}")
    missing = sorted(set(targets) - {name for _, name, _ in found})
    if missing:
        raise ValueError(f"模型里没有名为 {missing} 的 nn.Linear（targets 里的名字要是线性层的属性名，如 'w_q'）")
    users: dict[int, set[int]] = {}  # 参数 → 用到它的模块（共享权重时不止一个）
    for module in model.modules():
        for p in module.parameters(recurse=False):
            users.setdefault(id(p), set()).add(id(module))
    shared = sorted({name for _, name, child in found
                     if isinstance(child, nn.Linear) and len(users.get(id(child.weight), ())) > 1})
    if shared:
        raise ValueError(f"{shared} 的权重与别的模块共享（如与词嵌入共享的输出层）：合并 LoRA 时会连那个模块一起改掉；"
                         "请换别的目标，或先解开共享")
    return found


def apply_lora(model: nn.Module, rank: int, alpha: float, targets=("w_q", "w_v"), dropout: float = 0.0) -> nn.Module:
    """原地给 ``model`` 里属性名在 ``targets`` 中的每个 ``nn.Linear`` 加上 LoRA，并冻结模型的**全部**其他参数；返回 ``model``。

    默认只适配注意力的 W^Q 与 W^V（LoRA 论文与 peft 的常见选择）；前馈网络是 ``("w_1", "w_2")``（SwiGLU 还有 ``"w_3"``）。
    已经加过 LoRA 的模型再调用会报错。
    """
    check_model(model)
    check_no_lora(model)
    found = find_targets(model, targets)
    adapters: dict[int, LoRALinear] = {}  # 同一个线性层（经几条路径到达）只配一条支路
    for _, _, linear in found:
        if id(linear) not in adapters:
            adapters[id(linear)] = LoRALinear(linear, rank, alpha, dropout)
    for p in model.parameters():
        p.requires_grad_(False)
    for adapter in adapters.values():
        for p in (adapter.lora_A, adapter.lora_B):
            p.requires_grad_(True)
    for parent, name, linear in found:
        setattr(parent, name, adapters[id(linear)])
    return model


def merge_lora(model: nn.Module) -> nn.Module:
    """把每个 :class:`LoRALinear` 合并并换回普通的 ``nn.Linear``（peft 的 ``merge_and_unload``）；原地修改，返回 ``model``
    （``model`` 本身是一个 :class:`LoRALinear` 时返回合并后的 ``nn.Linear``）。

    量化的底座（QLoRA）先反量化成浮点的 ``nn.Linear``（:meth:`LoRALinear.dequantize_base`）再合并成 ``Ŵ + (α/r)·BA``；
    **没加 LoRA 的量化层保持量化**。要整个模型都是浮点（与训练时算的是同一个函数），再调用
    :func:`~tformer_lib.quant.dequantize_model`；要部署成整数格式，对这个浮点的结果调用 :func:`~tformer_lib.quant.quantize_model`
    （它拒绝还含量化层的模型；重新量化合并后的权重会带来新的舍入误差）。
    """
    check_model(model)
    if isinstance(model, LoRALinear):
        return model.dequantize_base().merge().base
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if isinstance(child, LoRALinear):
                child.dequantize_base().merge()  # 经两条路径到达的同一个支路只合并一次（已合并时什么也不做）
                setattr(parent, name, child.base)
    return model


def lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """只含 LoRA 支路（``lora_A``、``lora_B``）的状态字典：适配器文件只需存这些。"""
    check_model(model)
    return {k: v for k, v in model.state_dict().items() if k.endswith((".lora_A", ".lora_B"))}


def trainable_parameters(model: nn.Module) -> int:
    """要求梯度的参数个数（共享的参数只算一次）。"""
    check_model(model)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
