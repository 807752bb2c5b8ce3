"""缩放点积注意力（scaled dot-product attention）与多头注意力（multi-head attention）。

两条路径，结果一致（测试保证）：
- 显式路径：matmul → softmax → matmul，逐步可见，并返回注意力权重，供教学与画图；
- 快速路径：``torch.nn.functional.scaled_dot_product_attention``，用于训练，不返回权重。
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.torch_version import TorchVersion

from .._checks import (
    broadcast_shape,
    attention_inputs,
    autocast_enabled,
    bool_mask,
    dropout_rate,
    finite_positive,
    flag,
    module_dtype,
    non_empty_sequence,
    positive_int,
    same_batch,
    same_dtype,
    tensor_with_dim,
)
from .kv_cache import AttentionCache
from .masks import causal_mask
from .positional import RopeTables, alibi_bias
from .rope_scaling import RopeScaling


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout: nn.Module | None = None,
    *,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""显式路径的注意力 :math:`\mathrm{softmax}(QK^\top/\sqrt{d_k})V`，返回 ``(output, weights)``。

    形状：``q`` 为 ``(..., T_q, d_k)``，``k`` 为 ``(..., T_k, d_k)``，``v`` 为 ``(..., T_k, d_v)``；
    ``mask`` 为布尔张量（True = 可以关注），能广播到分数形状 ``(..., T_q, T_k)``。
    被屏蔽的分数填 ``torch.finfo(dtype).min``；softmax 之后再把被屏蔽的权重置为 0，
    因此被屏蔽处的权重恰好为 0，整行都被屏蔽时输出全 0 而不是 NaN。
    返回的 ``weights`` 是 dropout 之前的权重。
    ``bias``：加在分数上的浮点偏置（如 ALiBi 的 ``-m·|i-j|``，第 16 章），能广播到分数形状；在掩码之前加。
    """
    attention_inputs(q, k, v)
    d_k = q.shape[-1]
    # 计算 Q K^T / sqrt(d_k)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., T_q, T_k)
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or not bias.is_floating_point():
            raise TypeError(f"bias 应是浮点张量，收到 {getattr(bias, 'dtype', type(bias).__name__)}")
        try:
            fits = torch.broadcast_shapes(bias.shape, scores.shape) == scores.shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"bias 的形状 {tuple(bias.shape)} 应能广播到分数的形状 {tuple(scores.shape)}")
        scores = scores + bias.to(scores.dtype)  # (..., T_q, T_k)
    if mask is not None:
        bool_mask("mask", mask, scores.shape)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)  # (..., T_q, T_k)，每行和为 1
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # 整行被屏蔽时为全 0
    attended = dropout(weights) if dropout is not None else weights
    return attended @ v, weights  # (..., T_q, d_v), (..., T_q, T_k)


SDPA_HAS_GQA = TorchVersion(torch.__version__) >= "2.5"  # F.scaled_dot_product_attention 的 enable_gqa 从 2.5 起才有


def _torch_sdpa(q, k, v, **kwargs) -> torch.Tensor:
    """调用 ``F.scaled_dot_product_attention``；遇到 PyTorch 在 CPU 上的一个已知缺陷时改用数学（math）后端。

    缺陷：在有 AMX 的 Intel CPU 上，若用 ``ATEN_CPU_CAPABILITY`` 选了低于 avx512 的内核集，
    bf16 的 flash 内核仍按硬件选择 AMX 的打包路径，随即报 "pack_vnni2 is only supported when avx512 is
    supported"（torch 2.13 实测）。数学后端算的是同一个公式，只是不分块、为反向保存的张量不同；别的错误照常抛出。
    想让这样的机器真像一台 avx2 机器（flash 内核照常可用），同时设 ``ONEDNN_MAX_CPU_ISA=AVX2``（CI 就这么做）。
    ``torch.compile`` 追踪时直接调用（编译出的内核不走这条路径，也避免在图里留下 try）。
    """
    if torch.compiler.is_compiling():
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    try:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    except RuntimeError as error:
        if "pack_vnni2" not in str(error):
            raise
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def _sdpa(q, k, v, mask, dropout_p: float = 0.0, causal: bool = False, gqa: bool = False,
          bias: torch.Tensor | None = None) -> torch.Tensor:
    """快速路径本身（不做参数检查，调用者已查过）：布尔掩码换成加性掩码，整行被屏蔽的输出置 0。

    ``causal=True``（这时 ``mask`` 为 None）交给 SDPA 的 ``is_causal``，不必造掩码——与等价的加性掩码前向、
    反向都逐位相同（CPU 上测试核对）。``gqa=True``：``k``/``v`` 的头少于 ``q``（GQA），交给 SDPA 的 ``enable_gqa``，
    每组查询头直接读共用的 K/V 头、不复制；前向与先复制 K/V 逐位相同，反向里同组各头的梯度求和的次序不同，
    只在舍入误差内相同（CPU 上测试核对）。
    ``bias``：加在分数上的浮点偏置（ALiBi）；这时因果掩码要自己造，与偏置合成一个加性掩码。
    """
    gqa = {"enable_gqa": True} if gqa else {}
    if bias is not None:
        if causal:
            mask = causal_mask(q.shape[-2], device=q.device)  # (T, T)
        if mask is None:
            return _torch_sdpa(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout_p, **gqa)
    elif mask is None:
        return _torch_sdpa(q, k, v, dropout_p=dropout_p, is_causal=causal, **gqa)
    fill = torch.tensor(torch.finfo(q.dtype).min, dtype=q.dtype, device=q.device)
    if bias is None:
        additive = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, fill)
    else:
        additive = torch.where(mask, bias.to(q.dtype), fill)  # 被屏蔽处恰为 finfo.min，其余是偏置
    out = _torch_sdpa(q, k, v, attn_mask=additive, dropout_p=dropout_p, **gqa)
    any_key = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)：这一行是否至少能看见一个键
    return out.masked_fill(~any_key, 0.0)  # (..., T_q, d_v)


def fast_scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """快速路径：调用 ``F.scaled_dot_product_attention``，掩码约定与显式路径相同，只返回输出。

    PyTorch 的布尔 ``attn_mask`` 也是 True = 参与注意力；但整行被屏蔽时，较早的版本与部分内核给出 NaN
    （torch 2.13 的 CPU 实现给 0）。为了在我们支持的所有版本上行为一致，这里把掩码换成加性浮点掩码
    （被屏蔽处为 ``finfo.min``），再把整行被屏蔽的输出置 0。
    """
    attention_inputs(q, k, v)
    if mask is not None:
        score_shape = (*broadcast_shape(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
        bool_mask("mask", mask, score_shape)
    return _sdpa(q, k, v, mask, dropout_p)


class MultiHeadAttention(nn.Module):
    """多头注意力：把 d_model 维切成 h 个头，各自做一次注意力，再拼接并用 W^O 混合。

    属性 ``w_q, w_k, w_v, w_o`` 就是论文中的 W^Q、W^K、W^V、W^O（各一个 ``nn.Linear(d_model, d_model)``）。
    显式路径下，``attn_weights`` 保存最近一次的注意力权重 ``(B, h, T_q, T_k)``；快速路径下为 ``None``。

    现代大模型的两个扩展（默认关闭，关闭时与论文完全相同）：

    - 分组查询注意力（grouped-query attention, GQA）：``n_kv_heads`` 个 K/V 头由 ``n_heads / n_kv_heads`` 个
      查询头共用，``w_k``/``w_v`` 只投影到 ``n_kv_heads · d_k`` 维，K/V 缓存也只存这么多；
      ``n_kv_heads=1`` 即多查询注意力（multi-query attention, MQA），``n_kv_heads=n_heads`` 即普通 MHA。
      第 i 个查询头用第 ``i // (n_heads / n_kv_heads)`` 个 K/V 头。
    - 旋转位置编码（RoPE）：``rope=True`` 时在打分前用 :func:`~tformer_lib.parts.positional.apply_rope` 旋转每个头的
      q 与 k（只用于自注意力）；位置默认从缓存长度接着数，也可由 ``positions`` 给出。
    - ALiBi（attention with linear biases，第 16 章）：``alibi=True`` 时第 h 个头给每个分数加上
      ``-m_h·(i-j)``（:func:`~tformer_lib.parts.positional.alibi_bias`），不旋转、不加位置向量。距离按序列里的槽位数：
      查询是键里的最后 T_q 个（左填充与打包都不改变同一行里两个真实词元的距离）。只用于自注意力，
      缓存只能是普通的 :class:`~tformer_lib.AttentionCache`（静态缓存与分页缓存的槽位不按序排列，拒绝）。

    偏置：论文与 GPT-2 的四个投影都带偏置（默认）；``qkv_bias=False`` 去掉 W^Q、W^K、W^V 的偏置，
    ``out_bias=False`` 去掉 W^O 的偏置（LLaMA 两个都没有，Qwen2 只有 q/k/v 的偏置）。
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        fast: bool = False,
        n_kv_heads: int | None = None,
        rope: bool = False,
        rope_base: float = 10000.0,
        *,
        qkv_bias: bool = True,
        out_bias: bool = True,
        rope_scaling: RopeScaling | None = None,
        alibi: bool = False,
    ):
        super().__init__()
        positive_int("d_model", d_model)
        positive_int("n_heads", n_heads)
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} 不能被 n_heads={n_heads} 整除")
        dropout_rate("dropout", dropout)
        flag("fast", fast)
        flag("qkv_bias", qkv_bias)
        flag("out_bias", out_bias)
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        n_kv_heads = n_heads if n_kv_heads is None else positive_int("n_kv_heads", n_kv_heads)
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} 不能被 n_kv_heads={n_kv_heads} 整除：每组查询头的个数必须是整数")
        if rope and self.d_k % 2 != 0:
            raise ValueError(f"RoPE 要求每头维度 d_k 为偶数，收到 d_k={self.d_k}（d_model={d_model}, n_heads={n_heads}）")
        self.n_kv_heads = n_kv_heads
        self.rope, self.rope_base = flag("rope", rope), finite_positive("rope_base", rope_base)
        if rope_scaling is not None and not isinstance(rope_scaling, RopeScaling):
            raise TypeError(f"rope_scaling 应是 RopeScaling 或 None，收到 {type(rope_scaling).__name__}")
        if rope_scaling is not None and not rope:
            raise ValueError("rope_scaling 只在 rope=True 时起作用，收到 rope=False")
        self.rope_scaling = rope_scaling  # 第 16 章：PI / NTK / YaRN；None = 原始 RoPE
        self.alibi = flag("alibi", alibi)
        if alibi and rope:
            raise ValueError("alibi=True 与 rope=True 只能选一个：两者都是给注意力的位置信息")
        self.w_q = nn.Linear(d_model, d_model, bias=qkv_bias)
        self.w_k = nn.Linear(d_model, n_kv_heads * self.d_k, bias=qkv_bias)  # GQA 时比 d_model 窄
        self.w_v = nn.Linear(d_model, n_kv_heads * self.d_k, bias=qkv_bias)
        self.w_o = nn.Linear(d_model, d_model, bias=out_bias)
        self.dropout = nn.Dropout(dropout)
        self.fast = fast
        self.attn_weights: torch.Tensor | None = None

    def split_heads(self, x: torch.Tensor, n_heads: int | None = None) -> torch.Tensor:
        """``(B, T, h·d_k)`` → ``(B, h, T, d_k)``：先把最后一维拆成 (h, d_k)，再把 h 换到前面。

        ``n_heads`` 默认是查询头数 h；拆 K/V 时传 ``n_kv_heads``。
        """
        batch, length, _ = x.shape
        heads = self.n_heads if n_heads is None else n_heads
        return x.view(batch, length, heads, self.d_k).transpose(1, 2)  # (B, h, T, d_k)

    def _rope(self, positions, query: torch.Tensor, cache: AttentionCache | None) -> RopeTables:
        """这一步的 RoPE 表：模型已为各层算好的 :class:`~tformer_lib.parts.positional.RopeTables` 原样用；
        给的是位置编号 ``(T,)``/``(B, T)`` 就现算；都没给时从已缓存的长度接着数。"""
        batch, length = query.shape[:2]
        if isinstance(positions, RopeTables):
            if (positions.length, positions.d, positions.base) != (length, self.d_k, self.rope_base):
                raise ValueError(
                    f"positions 这张 RopeTables 按 (T={positions.length}, d={positions.d}, base={positions.base}) 建成，"
                    f"这一层需要 (T={length}, d={self.d_k}, base={self.rope_base})")
            if positions.scaling != self.rope_scaling:
                raise ValueError(f"positions 这张 RopeTables 的缩放是 {positions.scaling}，这一层是 {self.rope_scaling}")
            if positions.batch not in (None, batch):
                raise ValueError(f"positions 这张 RopeTables 按批大小 {positions.batch} 建成，query 的批大小是 {batch}")
            return positions
        if positions is None:
            start = cache.cached_length() if cache is not None else 0
            positions = torch.arange(start, start + length, device=query.device)  # (T,)
        elif not isinstance(positions, torch.Tensor) or tuple(positions.shape) not in ((length,), (batch, length)):
            raise ValueError(f"positions 的形状应为 ({length},) 或 ({batch}, {length})，"
                             f"收到 {tuple(getattr(positions, 'shape', ())) or type(positions).__name__}")
        return RopeTables(positions, self.d_k, self.rope_base, self.rope_scaling)

    def _alibi(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cache) -> torch.Tensor:
        """这一步的 ALiBi 偏置 ``(h, T_q, T_k)``，与 query 同 dtype；先拒绝它算不对的情形。"""
        if not (key is query and value is query):
            raise ValueError("ALiBi 只用于自注意力：query、key、value 应是同一个张量")
        if cache is not None and type(cache) is not AttentionCache:
            raise ValueError(f"ALiBi 按槽位数距离，只支持普通的 AttentionCache，收到 {type(cache).__name__}"
                             "（静态缓存与分页缓存里键的槽位不是按序排列的）")
        t_k = query.shape[1] if cache is None else cache.key_length(query.shape[1])
        return alibi_bias(self.n_heads, query.shape[1], t_k, device=query.device).to(query.dtype)  # (h, T_q, T_k)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, h, T, d_k)`` → ``(B, T, d_model)``：split_heads 的逆操作（即“拼接各头”）。"""
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.d_model)  # (B, T, h·d_k)

    def _check_inputs(self, query, key, value, cache: AttentionCache | None = None) -> None:
        self_attention = key is query and value is query  # 自注意力：三个是同一个张量，查一次就够
        for name, x in (("query", query),) if self_attention else (("query", query), ("key", key), ("value", value)):
            tensor_with_dim(name, x, 3, "(B, T, d_model)")
            non_empty_sequence(name, x)
        if query.shape[-1] != self.d_model:
            raise ValueError(f"query 的最后一维是 {query.shape[-1]}，但这一层的 d_model={self.d_model}")
        module_dtype("query", query, self)
        if cache is not None and cache.k is not None:  # 已缓存的 K/V 与这一步的 query 同批（交叉注意力时 key 不再使用）
            same_batch(("query", query), ("cache.k", cache.k))
        if self_attention:
            return
        if key.shape[-1] != query.shape[-1] or value.shape[-1] != query.shape[-1]:
            raise ValueError(
                f"query、key、value 的最后一维 d_model 应相同，收到 query {tuple(query.shape)}、"
                f"key {tuple(key.shape)}、value {tuple(value.shape)}"
            )
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"key 与 value 的 (B, T_k) 应相同，收到 {tuple(key.shape)} 与 {tuple(value.shape)}")
        if cache is None or not cache.static or cache.k is None:
            same_batch(("query", query), ("key", key))
        if not autocast_enabled(query):  # 混合精度下 dtype 不同是正常的
            same_dtype(("query", query), ("key", key), ("value", value))

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: AttentionCache | None = None,
        positions: torch.Tensor | RopeTables | None = None,
        *,
        causal: bool = False,
    ) -> torch.Tensor:
        """``query`` ``(B, T_q, d_model)``，``key``/``value`` ``(B, T_k, d_model)`` → ``(B, T_q, d_model)``。

        ``mask``：布尔，True = 可以关注，能广播到 ``(B, h, T_q, T_k)``。
        ``causal=True``：因果掩码（第 i 个查询只看前 i 个键），不必另给 ``mask``；要求 ``T_q = T_k``（缓存为空）。
        快速路径把它交给 SDPA 的 ``is_causal``，不造 ``(T, T)`` 的掩码；与给 ``mask=causal_mask(T)`` 逐位相同（CPU 上测试核对）。
        ``cache``：增量解码用的 K/V 缓存（见 :mod:`tformer_lib.parts.kv_cache`）；GQA 时只缓存 ``n_kv_heads`` 个头。
        ``positions``：只在 ``rope=True`` 时使用，新位置的位置编号 ``(T_q,)`` 或 ``(B, T_q)``，
        或模型为各层算好的 :class:`~tformer_lib.parts.positional.RopeTables`。
        """
        self._check_inputs(query, key, value, cache)
        flag("causal", causal)
        # 先查掩码与 causal，再投影：出错时缓存里还没写进这一步的 K、V
        t_k = key.shape[1] if cache is None else cache.key_length(key.shape[1])
        if causal and mask is not None:
            raise ValueError("causal=True 时不再另给 mask（两者只能选一个；要与别的掩码合并，请自己造布尔掩码）")
        if causal and t_k != query.shape[1]:
            raise ValueError(f"causal=True 要求查询与键一样长（没有已缓存的键），收到 T_q={query.shape[1]}、T_k={t_k}")
        if mask is not None:
            bool_mask("mask", mask, (query.shape[0], self.n_heads, query.shape[1], t_k))  # 分数的形状 (B, h, T_q, T_k)
        bias = self._alibi(query, key, value, cache) if self.alibi else None  # (h, T_q, T_k) 或 None
        # 1) 线性投影 Q = X W^Q 等，并拆成多个头（K、V 只有 n_kv_heads 个头）
        q = self.split_heads(self.w_q(query))  # (B, h, T_q, d_k)
        if cache is not None and cache.static and cache.k is not None:
            k, v = cache.k, cache.v  # 交叉注意力：编码器输出的 K、V 只算一次
        else:
            k = self.split_heads(self.w_k(key), self.n_kv_heads)  # (B, h_kv, T_k, d_k)
            v = self.split_heads(self.w_v(value), self.n_kv_heads)  # (B, h_kv, T_k, d_k)
            if self.rope:  # 旋转位置编码：在进缓存之前旋转 q、k，缓存里存的是已旋转的 k
                if key.shape[1] != query.shape[1]:
                    raise ValueError(
                        f"RoPE 只用于自注意力：query 长度 {query.shape[1]} 与 key 长度 {key.shape[1]} 不同"
                    )
                rope = self._rope(positions, query, cache)
                q, k = rope.rotate(q), rope.rotate(k)  # (B, h, T, d_k), (B, h_kv, T, d_k)
            if cache is not None:
                k, v = cache.update(k, v)  # 自注意力：把新位置的 K、V 接在已缓存的后面
        # GQA：每个 K/V 头由同组的查询头共用。快速路径让 SDPA 直接按组读（enable_gqa，不复制，训练也一样）；
        # 显式路径把它复制给同组的查询头（复制的反向把同组的梯度加回一个头）
        if self.n_kv_heads != self.n_heads and not (self.fast and SDPA_HAS_GQA):
            group = self.n_heads // self.n_kv_heads
            k = k.repeat_interleave(group, dim=1)  # (B, h, T_k, d_k)
            v = v.repeat_interleave(group, dim=1)  # (B, h, T_k, d_k)
        # 2) 每个头各自做一次缩放点积注意力
        if self.fast:
            dropout_p = self.dropout.p if self.training else 0.0
            out = _sdpa(q, k, v, mask, dropout_p, causal, gqa=k.shape[1] != q.shape[1], bias=bias)  # (B, h, T_q, d_k)
            self.attn_weights = None
        else:
            if causal:
                mask = causal_mask(q.shape[2], device=q.device)  # (T, T)
            out, weights = scaled_dot_product_attention(q, k, v, mask, self.dropout, bias=bias)  # (B, h, T_q, d_k)
            self.attn_weights = weights.detach()  # (B, h, T_q, T_k)
        # 3) 拼接各头，再用 W^O 做一次线性变换
        return self.w_o(self.merge_heads(out))  # (B, T_q, d_model)
