r"""RoPE 缩放（RoPE scaling，第 16 章）：让在长度 L 上训练的模型读 s·L 长的序列。

RoPE 的第 i 对维度以频率 :math:`\theta_i = b^{-2i/d}` 旋转（b 是 base）。位置超过 L 时，低频的几对维度转到了训练中
从没见过的角度——这是 RoPE 模型读长序列时困惑度爆炸的主要原因。三种办法，都只改频率（和一个温度）：

- **位置插值**（position interpolation, PI；``kind="linear"``，Chen et al. 2023）：所有频率除以 s，
  :math:`\theta'_i = \theta_i / s`——等价于把位置 t 当作 t/s，s·L 长的序列被压回训练见过的角度范围；
  代价是相邻位置的角度差也缩小了 s 倍，高频维度分辨近距离的能力变差，通常要短暂微调。
- **NTK-aware**（``kind="ntk"``，bloc97 2023）：只换 base，:math:`b' = b\,s^{d/(d-2)}`。最高频（i = 0）不变，
  最低频（i = d/2 − 1）恰好被除以 s，中间平滑过渡：近处的分辨率保留，远处被插值。不微调也能用一些。
- **YaRN**（``kind="yarn"``，Peng et al. 2023）：按“这对维度在训练长度里转了几圈” :math:`r_i = L\theta_i / 2\pi` 分段：
  转得多（:math:`r_i > \beta_{fast}`）的不动，转得少（:math:`r_i < \beta_{slow}`）的做 PI，中间线性过渡；
  另把 cos、sin 都乘 :math:`0.1\ln s + 1`（注意力的温度，q·k 因此乘它的平方）。

实现与 Hugging Face ``transformers`` 的 ``linear`` 与 ``yarn``（``modeling_rope_utils``）逐项相同（测试对照）；
``ntk`` 是静态的 NTK-aware，HF 没有同名的类型（它的 ``dynamic`` 随序列长度改变 base，不是这个）。
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from .._checks import finite_real, positive_int

__all__ = ["ROPE_SCALINGS", "RopeScaling", "rope_frequencies", "scaled_rope_angles", "yarn_attention_factor"]

#: 支持的缩放方式
ROPE_SCALINGS = ("linear", "ntk", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE 缩放的设置：``kind`` 是 :data:`ROPE_SCALINGS` 之一，``factor`` = s ≥ 1（想读的长度 / 训练长度）。

    YaRN 另需 ``original_max_len``（训练时的上下文长度 L）与 ``beta_fast``、``beta_slow``（默认 32 与 1，论文与 HF 的取值）。
    """

    kind: str
    factor: float
    original_max_len: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def __post_init__(self):
        if self.kind not in ROPE_SCALINGS:
            raise ValueError(f"kind 应是 {ROPE_SCALINGS} 之一，收到 {self.kind!r}")
        object.__setattr__(self, "factor", finite_real("factor", self.factor, at_least=1.0))
        if self.kind == "yarn":
            if (isinstance(self.original_max_len, bool) or not isinstance(self.original_max_len, int)
                    or self.original_max_len < 1):
                raise ValueError(f"kind='yarn' 需要 original_max_len（训练时的上下文长度，正整数），收到 {self.original_max_len!r}")
            beta_fast = finite_real("beta_fast", self.beta_fast, above=0.0)
            beta_slow = finite_real("beta_slow", self.beta_slow, above=0.0)
            if beta_slow >= beta_fast:
                raise ValueError(f"beta_slow={beta_slow:g} 应小于 beta_fast={beta_fast:g}")
            object.__setattr__(self, "beta_fast", beta_fast)
            object.__setattr__(self, "beta_slow", beta_slow)
        elif self.original_max_len is not None:
            raise ValueError(f"original_max_len 只用于 kind='yarn'，kind={self.kind!r} 时应为 None")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data) -> "RopeScaling":
        """从 :meth:`to_dict` 的字典还原（写进检查点的 :class:`~tformer_lib.lm.LMConfig` 用）；字段不对给出清楚的错误。"""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise TypeError(f"rope_scaling 应是 RopeScaling 或它的字典，收到 {type(data).__name__}")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown or "kind" not in data or "factor" not in data:
            raise ValueError(f"rope_scaling 的字典应有 kind、factor（可选 original_max_len、beta_fast、beta_slow），收到 {sorted(data)}")
        return cls(**data)


def yarn_attention_factor(factor: float) -> float:
    r"""YaRN 的注意力温度：cos、sin 乘的 :math:`0.1\ln s + 1`（s ≤ 1 时为 1）。"""
    factor = finite_real("factor", factor, above=0.0)
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def _yarn_ramp(d: int, base: float, scaling: RopeScaling) -> torch.Tensor:
    """每对维度“保持原频率”的权重 ``(d/2,)``：1 = 不动（外推），0 = 完全按 PI 插值。

    第 i 对维度在 L 个位置里转 :math:`L\\theta_i/2\\pi` 圈；转 r 圈的维度编号是
    :math:`i(r) = d\\ln(L / 2\\pi r) / (2\\ln b)`。在 :math:`i(\\beta_{fast})`（向下取整）之前全保持，
    :math:`i(\\beta_{slow})`（向上取整）之后全插值，中间线性过渡——与 HF 的 ``truncate=True`` 相同。
    """
    length = scaling.original_max_len

    def dim_of(rotations: float) -> float:
        return d * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(dim_of(scaling.beta_fast)), 0)
    high = min(math.ceil(dim_of(scaling.beta_slow)), d - 1)
    if low == high:
        high += 0.001  # 避免除以 0（HF 的做法）
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)  # (d/2,)：0 → 1
    return 1 - ramp


def rope_frequencies(d: int, base: float = 10000.0, scaling: RopeScaling | None = None) -> tuple[torch.Tensor, float]:
    r"""缩放后的频率 :math:`\theta'_i` ``(d/2,)``（float64）与 cos、sin 要乘的注意力系数（YaRN 以外为 1）。"""
    d = positive_int("d", d)
    if d < 2 or d % 2:
        raise ValueError(f"d 应是 ≥ 2 的偶数（每头维度），收到 {d!r}")
    base = finite_real("base", base, above=1.0)
    if scaling is not None and not isinstance(scaling, RopeScaling):
        raise TypeError(f"scaling 应是 RopeScaling 或 None，收到 {type(scaling).__name__}")
    exponents = torch.arange(0, d, 2, dtype=torch.float64) / d  # (d/2,)：2i/d
    theta = base ** -exponents  # (d/2,)：θ_i = b^{-2i/d}
    if scaling is None:
        return theta, 1.0
    s = scaling.factor
    if scaling.kind == "linear":
        return theta / s, 1.0
    if scaling.kind == "ntk":
        if d == 2:  # 只有一对维度：它既是最高频也是最低频，s^{d/(d−2)} 无定义
            raise ValueError("kind='ntk' 需要 d ≥ 4（只有一对维度时 s^{d/(d−2)} 无定义）")
        return (base * s ** (d / (d - 2))) ** -exponents, 1.0
    keep = _yarn_ramp(d, base, scaling)  # (d/2,)
    return theta / s * (1 - keep) + theta * keep, yarn_attention_factor(s)


def scaled_rope_angles(positions: torch.Tensor, d: int, base: float, scaling: RopeScaling) -> tuple[torch.Tensor, torch.Tensor]:
    """与 :func:`~tformer_lib.parts.positional.rope_angles` 相同，但用缩放后的频率，并把 cos、sin 乘注意力系数：
    ``positions`` ``(...)`` → 各 ``(..., d/2)``（float64）。"""
    if not isinstance(positions, torch.Tensor) or positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions 应是实数张量，收到 {getattr(positions, 'dtype', type(positions).__name__)}")
    theta, attention = rope_frequencies(d, base, scaling)
    angle = positions.to(torch.float64)[..., None] * theta.to(positions.device)  # (..., d/2)
    return angle.cos() * attention, angle.sin() * attention
