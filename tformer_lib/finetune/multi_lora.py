r"""一个底座、多个适配器，同一批里服务（multi-LoRA serving，S-LoRA / Punica 的思路）。

合并（:func:`~tformer_lib.finetune.merge_lora`）让一个适配器零开销，但每个适配器就成了一整份模型；几十个客户
各有自己的适配器时，显存放不下几十份权重。不合并就可以共用底座：每个线性层算一次底座
:math:`x W^\top`，再按**每个词元**属于哪个适配器，只给那几行加上它自己的 :math:`\frac{\alpha}{r}\,(x A_i^\top) B_i^\top`。
底座的矩阵乘法由整批分摊，每个适配器只多出两个很窄的矩阵乘法（秩 r ≪ d）。

用法::

    adapters = AdapterSet(model, {"dufu": load_adapter("dufu.pt"), "libai": load_adapter("libai.pt")})
    with adapters.route(ids):      # ids (B, T)：每个词元的适配器编号，-1 = 只用底座
        logits = model(tokens)     # tokens (B, T)

:class:`~tformer_lib.serving.Engine` 的 ``adapters=`` 参数替每一步构造 ``ids``：请求各自指明 ``adapter``。
``route`` 之外，模型就是原来的底座。
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager

import torch
from torch import nn

from .adapter_file import check_adapter_fits
from .lora import QUANTIZED_BASES, LoRALinear

__all__ = ["MultiLoRALinear", "AdapterSet"]


class MultiLoRALinear(nn.Module):
    """冻结的 ``base``（``nn.Linear``，或 QLoRA 的量化层）加若干条支路；每个词元走哪一条由所属 :class:`AdapterSet`
    当前的路由决定。"""

    def __init__(self, base: nn.Module, router: "AdapterSet"):
        super().__init__()
        if type(base) is not nn.Linear and not isinstance(base, QUANTIZED_BASES):
            raise TypeError(f"base 应是 nn.Linear 或量化的线性层（Int8Linear、Int4Linear），收到 {type(base).__name__}")
        self.base = base
        self._router = router  # 不是子模块：只读它的路由
        self.scaling: dict[int, float] = {}  # 适配器编号 → α/r；A、B 是 buffer（随 .to() 移动）：lora_A_{编号}、lora_B_{编号}

    def add(self, index: int, lora_A: torch.Tensor, lora_B: torch.Tensor, scaling: float) -> None:
        """加第 ``index`` 条支路（``index`` ≥ 0；-1 在路由里表示“只用底座”，不能用作支路的编号）。"""
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"index 应是非负整数（-1 留给“只用底座”），收到 {index!r}")
        if index in self.scaling:
            raise ValueError(f"第 {index} 条支路已经加过")
        if lora_A.shape != (lora_A.shape[0], self.base.in_features) or lora_B.shape != (self.base.out_features, lora_A.shape[0]):
            raise ValueError(f"A {tuple(lora_A.shape)}、B {tuple(lora_B.shape)} 与底座 ({self.base.out_features}, "
                             f"{self.base.in_features}) 对不上")
        ref = next(t for t in self.base.state_dict().values() if t.is_floating_point())  # 底座的浮点类型与设备
        self.register_buffer(f"lora_A_{index}", lora_A.detach().to(ref))
        self.register_buffer(f"lora_B_{index}", lora_B.detach().to(ref))
        self.scaling[index] = float(scaling)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # (..., out)：整批共用的底座
        ids = self._router.ids
        if ids is None:
            return y
        if ids.shape != x.shape[:-1]:
            raise ValueError(f"路由 ids 的形状 {tuple(ids.shape)} 应等于输入去掉最后一维 {tuple(x.shape[:-1])}")
        for index, scaling in self.scaling.items():
            rows = ids == index  # (...,) 这个适配器的词元
            if bool(rows.any()):
                lora_A, lora_B = getattr(self, f"lora_A_{index}"), getattr(self, f"lora_B_{index}")
                picked = x[rows]  # (n, in)
                y = y.index_put((rows,), scaling * (picked @ lora_A.T @ lora_B.T), accumulate=True)  # (n, r) → (n, out)
        return y

    def extra_repr(self) -> str:
        return f"adapters={sorted(self.scaling)}"


class AdapterSet:
    """把 ``adapters``（名字 → 适配器字典，:func:`~tformer_lib.finetune.load_adapter`）装到同一个底座 ``model`` 上（原地）。

    每个适配器的底座配置与格式都必须与 ``model`` 相同（QLoRA 的适配器要量化过的底座，
    :func:`~tformer_lib.finetune.adapter_file.quantize_base_for`）；它们的秩、α 与目标层可以各不相同。``model``
    必须是没有加过 LoRA 的模型。所有检查都在改动 ``model`` 之前做完。推理专用：装上后 ``model`` 的参数都不要求梯度。
    """

    def __init__(self, model: nn.Module, adapters: Mapping[str, dict]):
        if not isinstance(adapters, Mapping) or not adapters:
            raise TypeError(f"adapters 应是非空的 {{名字: 适配器}} 字典，收到 {type(adapters).__name__}")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model 应是 nn.Module，收到 {type(model).__name__}")
        if any(isinstance(m, (LoRALinear, MultiLoRALinear)) for m in model.modules()):
            raise ValueError("model 已经加过 LoRA 或适配器：请从原来的底座开始")
        for name, adapter in adapters.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"适配器的名字应是非空字符串，收到 {name!r}")
            check_adapter_fits(model, adapter, f"适配器 {name!r}")
        self.model, self.names, self.ids = model, tuple(adapters), None
        bases = dict(model.named_modules())  # 检查都过了：每个适配器的每个键都对应一个目标线性层
        layers: dict[int, MultiLoRALinear] = {}  # id(底座层) → 它的多支路层
        for index, adapter in enumerate(adapters.values()):
            for key in adapter["state"]:
                module_name, _, kind = key.rpartition(".")
                if kind == "lora_A":
                    base = bases[module_name]
                    if id(base) not in layers:
                        layers[id(base)] = MultiLoRALinear(base, self)
                    layers[id(base)].add(index, adapter["state"][key], adapter["state"][f"{module_name}.lora_B"],
                              adapter["alpha"] / adapter["rank"])
        for parent in list(model.modules()):  # 换掉每一条路径（同一个层经两条路径到达时两条都换）
            for child_name, child in list(parent._modules.items()):
                if id(child) in layers:
                    setattr(parent, child_name, layers[id(child)])
        for p in model.parameters():
            p.requires_grad_(False)

    def index(self, name: str | None) -> int:
        """适配器名字 → 编号；``None`` → -1（只用底座）。"""
        if name is None:
            return -1
        if name not in self.names:
            raise ValueError(f"没有名为 {name!r} 的适配器；可选：{list(self.names)}（或 None = 底座）")
        return self.names.index(name)

    @contextmanager
    def route(self, ids: torch.Tensor):
        """在这个上下文里，模型的每个词元按 ``ids``（与输入词元同形的整数张量，-1 = 底座）走各自的适配器。"""
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long:
            raise TypeError(f"ids 应是 LongTensor（每个词元的适配器编号），收到 {getattr(ids, 'dtype', type(ids).__name__)}")
        if ids.numel() and (int(ids.min()) < -1 or int(ids.max()) >= len(self.names)):
            raise ValueError(f"ids 的取值应在 [-1, {len(self.names) - 1}] 内，收到 [{int(ids.min())}, {int(ids.max())}]")
        previous, self.ids = self.ids, ids
        try:
            yield self
        finally:
            self.ids = previous
