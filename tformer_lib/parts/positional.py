"""位置编码（positional encoding）：把“第几个位置”变成能与词嵌入相加的向量。

本模块有四种做法：
- 正弦余弦位置编码（sinusoidal），与论文公式逐项一致，没有参数；
- 可学习位置嵌入（learned positional embedding），每个位置一行参数；
- 旋转位置编码 RoPE（rotary position embedding），作用在 Q、K 上，采用“前后两半”（half-split）约定；
- ALiBi（attention with linear biases），直接给注意力分数加一个与距离成正比的偏置。
"""

import math

import torch
from torch import nn

from .._checks import broadcast_shape, dropout_rate, finite_positive, last_dim, non_negative_int, positive_int, tensor_with_dim
from .rope_scaling import RopeScaling, scaled_rope_angles


def sinusoidal_positional_encoding(max_len: int, d_model: int) -> torch.Tensor:
    r"""论文的正弦余弦位置编码，返回 ``(max_len, d_model)``。

    .. math::
        PE(pos, 2i) = \sin\!\left(pos / 10000^{2i/d_{model}}\right),\quad
        PE(pos, 2i+1) = \cos\!\left(pos / 10000^{2i/d_{model}}\right)

    偶数维用正弦、奇数维用余弦；同一对 (2i, 2i+1) 共用一个频率。先用 float64 计算再转成 float32。
    """
    positive_int("max_len", max_len)
    positive_int("d_model", d_model)
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d_model/2),) 即 2i
    angle = pos / (10000.0 ** (two_i / d_model))  # (max_len, ceil(d_model/2))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)  # 偶数维：sin
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])  # 奇数维：cos（d_model 为奇数时少一列）
    return pe.to(torch.float32)


def _check_positions(x: torch.Tensor, start: int, max_len: int, d_model: int) -> int:
    tensor_with_dim("x", x, 3, "(B, T, d_model)")
    last_dim("x", x, d_model, "这个位置编码模块的 d_model")
    length = x.shape[1]
    start = non_negative_int("start", start)
    if start + length > max_len:
        raise ValueError(
            f"x 的长度 {length} 从位置 {start} 开始，超出了位置编码的 max_len={max_len}；"
            f"请用更大的 max_len 建模型，或缩短输入"
        )
    return length


class SinusoidalPositionalEncoding(nn.Module):
    """把正弦余弦位置编码加到输入上：``dropout(x + PE[start : start + T])``。"""

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0):
        super().__init__()
        self.d_model = positive_int("d_model", d_model)
        self.max_len = positive_int("max_len", max_len)
        self.dropout = nn.Dropout(dropout_rate("dropout", dropout))
        # 固定编码不是参数；persistent=False 让检查点不必保存它。
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model), persistent=False)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        length = _check_positions(x, start, self.max_len, self.d_model)
        return self.dropout(x + self.pe[start : start + length].to(x.dtype))  # (B, T, d_model)


class LearnedPositionalEmbedding(nn.Module):
    """可学习的位置嵌入：位置 ``pos`` 查表得到一行参数，再加到输入上。"""

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0):
        super().__init__()
        self.d_model = positive_int("d_model", d_model)
        self.max_len = positive_int("max_len", max_len)
        self.embedding = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout_rate("dropout", dropout))

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        length = _check_positions(x, start, self.max_len, self.d_model)
        positions = torch.arange(start, start + length, device=x.device)  # (T,)
        return self.dropout(x + self.embedding(positions))  # (B, T, d_model)


class NoPositionalEncoding(nn.Module):
    """不加任何位置信号（用于消融实验 ablation），只做 dropout。"""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout_rate("dropout", dropout))

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        tensor_with_dim("x", x, 3, "(B, T, d_model)")
        return self.dropout(x)


def _check_rope_angles(positions, d, base) -> None:
    """:func:`rope_angles` 的参数检查：位置是实数张量，``d`` 是正的偶数，``base`` 是有限的正数。"""
    if not isinstance(positions, torch.Tensor) or positions.dtype == torch.bool or positions.is_complex():
        got = positions.dtype if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise TypeError(f"positions 应是整数（位置插值时可为浮点）的张量，收到 {got}")
    if positions.is_floating_point() and not bool(torch.isfinite(positions).all()):
        raise ValueError("positions 里有 NaN 或 inf：位置应是有限的数")
    d = positive_int("d", d)
    if d % 2:
        raise ValueError(f"d 应是正的偶数（每头维度），收到 {d!r}")
    finite_positive("base", base)


def _check_rotate_pairs(x, cos, sin) -> None:
    """:func:`rotate_pairs` 的参数检查：``x`` 是最后一维为偶数的浮点张量，``cos``/``sin`` 能广播到 ``(..., T, d/2)``。"""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 2 or x.shape[-1] % 2:
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x 应是形状为 (..., T, d)、d 为偶数的浮点张量，收到 {got}")
    half_shape = (*x.shape[:-1], x.shape[-1] // 2)  # (..., T, d/2)
    for name, table in (("cos", cos), ("sin", sin)):
        if not isinstance(table, torch.Tensor) or broadcast_shape(table.shape, half_shape) != half_shape:
            got = tuple(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__
            raise ValueError(f"{name} 应能广播到 x 的一半形状 {half_shape}，收到 {got}")


def rope_angles(positions: torch.Tensor, d: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    r"""RoPE 的旋转角 :math:`\mathrm{pos}\cdot θ_i` 的 cos 与 sin，在 float64 里算：``positions`` ``(...)`` → 各 ``(..., d/2)``。

    :math:`θ_i = base^{-2i/d}`；float64 让大位置（几千、几万）的角度也准确，用的时候再转成 q、k 的 dtype。
    位置通常是整数；位置插值（position interpolation）把位置按比例缩小，这时可以是浮点。
    """
    _check_rope_angles(positions, d, base)
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=positions.device) / d)  # (d/2,)
    angle = positions.to(torch.float64)[..., None] * theta  # (..., d/2)
    return angle.cos(), angle.sin()


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """把 ``x`` ``(..., T, d)`` 的第 i 维与第 i + d/2 维配成一对，按角度旋转；``cos``/``sin`` 能广播到 ``(..., T, d/2)``。

    先检查参数，再交给 :func:`_rotate_pairs` 旋转；:class:`RopeTables` 自己核对过形状，直接调用后者。
    """
    _check_rotate_pairs(x, cos, sin)
    return _rotate_pairs(x, cos, sin)


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """旋转本身（不检查参数）：每一对 ``(x1, x2)`` 变成 ``(x1·cos − x2·sin, x1·sin + x2·cos)``。"""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # 各 (..., T, d/2)
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (..., T, d)
    return rotated.contiguous()  # d = 2 时两半各一列，cat 的结果不连续，SDPA 会退回数学后端；其余情形不复制


def apply_rope(x: torch.Tensor, positions: torch.Tensor | None = None, base: float = 10000.0) -> torch.Tensor:
    r"""旋转位置编码 RoPE：把最后一维的第 i 维与第 i + d/2 维配成一对，按 ``pos·θ_i`` 旋转。

    约定：前后两半（half-split，GPT-NeoX 与 LLaMA 的 HF 实现同此），:math:`θ_i = base^{-2i/d}`。
    ``x`` 形状 ``(..., T, d)``（d 为偶数），``positions`` 形状 ``(T,)``，默认 ``0..T-1``。
    性质：``<rope(q, m), rope(k, n)>`` 只依赖 ``m - n``。
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError(f"x 应是形状为 (..., T, d) 的张量，收到 {getattr(x, 'shape', type(x))}")
    length, d = x.shape[-2], x.shape[-1]
    if d % 2 != 0:
        raise ValueError(f"RoPE 要求 x 的最后一维是偶数，收到 d={d}")
    if positions is None:
        positions = torch.arange(length, device=x.device)
    if not isinstance(positions, torch.Tensor) or positions.shape != (length,):
        raise ValueError(f"positions 应是形状为 ({length},) 的张量，收到 {_shape_or_type(positions)}")
    cos, sin = rope_angles(positions, d, base)  # 各 (T, d/2)
    return rotate_pairs(x, cos.to(x.dtype), sin.to(x.dtype))  # (..., T, d)


class RopeTables:
    """一次前向里各层共用的 RoPE 表：角度只算一次，每种 dtype 只转换一次。

    ``positions`` 为 ``(T,)``（全批相同）时表是 ``(T, d/2)``，为 ``(B, T)``（每行不同，如左填充的批）时是
    ``(B, 1, T, d/2)``：两者都能广播到注意力里 q、k 的形状 ``(B, h, T, d)``。:meth:`rotate` 与逐层调用
    :func:`apply_rope` 逐位相同（测试核对），只是不必每层、每个 q 与 k 都重算一遍三角函数。
    表记下自己的 ``length``（T）、``d``、``base``、``scaling`` 与 ``batch``（``(T,)`` 的位置为 None）：用错了表会得到清楚的错误。
    ``scaling``：第 16 章的 :class:`~tformer_lib.parts.rope_scaling.RopeScaling`（PI、NTK、YaRN），None = 原始的 RoPE。
    """

    def __init__(self, positions: torch.Tensor, d: int, base: float = 10000.0, scaling: RopeScaling | None = None):
        if not isinstance(positions, torch.Tensor) or positions.dim() not in (1, 2):
            raise ValueError(f"positions 应是形状为 (T,) 或 (B, T) 的张量，收到 {_shape_or_type(positions)}")
        if scaling is None:
            cos, sin = rope_angles(positions, d, base)  # (T, d/2) 或 (B, T, d/2)
        else:
            _check_rope_angles(positions, d, base)
            cos, sin = scaled_rope_angles(positions, d, base, scaling)  # 缩放后的频率，YaRN 另乘注意力系数
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d/2)：所有头共用
        self.length, self.d, self.base, self.scaling = positions.shape[-1], d, float(base), scaling
        self.batch = positions.shape[0] if positions.dim() == 2 else None
        self._by_dtype = {torch.float64: (cos, sin)}

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """旋转 ``x`` ``(B, h, T, d)``（位置为 ``(T,)`` 时也可以是 ``(..., T, d)``），返回同形状。"""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise ValueError(f"x 应是浮点张量，收到 {getattr(x, 'dtype', type(x).__name__)}")
        if x.dim() < 2 or x.shape[-2] != self.length or x.shape[-1] != self.d:
            raise ValueError(f"x 的最后两维应是 (T={self.length}, d={self.d})，收到 {tuple(x.shape)}")
        if self.batch is not None and (x.dim() != 4 or x.shape[0] != self.batch):
            raise ValueError(f"这张表按 (B={self.batch}, T) 的位置建成，x 应是 ({self.batch}, h, T, d)，收到 {tuple(x.shape)}")
        if x.dtype not in self._by_dtype:
            cos, sin = self._by_dtype[torch.float64]
            self._by_dtype[x.dtype] = (cos.to(x.dtype), sin.to(x.dtype))
        return _rotate_pairs(x, *self._by_dtype[x.dtype])  # (..., T, d)


def _shape_or_type(value) -> str:
    """报错用：张量给形状，别的给类型名。"""
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi 每个头的斜率：头数为 2 的幂时是 ``2^(-8/h), 2^(-16/h), …``；否则按论文的插补办法。"""
    positive_int("n_heads", n_heads)

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (k + 1) for k in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes)


def alibi_bias(n_heads: int, t_q: int, t_k: int, device=None) -> torch.Tensor:
    """ALiBi 偏置 ``(h, T_q, T_k)``（float32）：第 h 个头给查询 i 与键 j 的分数加上 ``-m_h · |i - j|``。

    距离越远扣分越多；与因果掩码一起用时即论文的单向形式。查询与键右对齐：``T_q`` 个查询是 ``T_k`` 个键里的
    最后 ``T_q`` 个（增量解码时最后一个查询对应最后一个键）。``device``：偏置放在哪个设备上（默认 CPU）。
    """
    positive_int("t_q", t_q)
    positive_int("t_k", t_k)
    if t_q > t_k:
        raise ValueError(f"t_q={t_q} 个查询多于 t_k={t_k} 个键：查询应是键里的最后 t_q 个")
    q_pos = torch.arange(t_k - t_q, t_k, device=device)[:, None]  # (T_q, 1)
    k_pos = torch.arange(t_k, device=device)[None, :]  # (1, T_k)
    distance = (q_pos - k_pos).abs().to(torch.float32)  # (T_q, T_k)
    return -alibi_slopes(n_heads).to(device)[:, None, None] * distance  # (h, T_q, T_k)
