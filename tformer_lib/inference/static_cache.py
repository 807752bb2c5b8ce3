"""静态 K/V 缓存（static KV cache）：一次预分配好 ``(B, h_kv, L, d_k)``，之后每步原地写入，形状永远不变。

语言模型的动态缓存 :class:`~tformer_lib.lm.LMCache`（第 8 章的 K/V 缓存）每步 ``torch.cat`` 一次：缓存越来越长，每步都分配新内存，张量形状也每步都变。
形状一变，``torch.compile`` 捕获的图就不能复用。gpt-fast 的办法是：

- 开始时按最大长度 L（默认 ``config.max_len``）分配好全部 K、V，初值为 0；
- 每步只把新位置的 K、V 用 ``index_copy_`` 写进第 ``slots`` 个槽位（slot），**原地**修改；
- 注意力总是看全部 L 个槽位，还没写到的槽位由掩码屏蔽。

被屏蔽的分数在 softmax 之后恰好是 0，所以多看的那些槽位不改变结果（只可能改变浮点求和的顺序，
测试核对生成的词元与动态缓存相同）。代价是每步注意力都按 L 而不是按已有长度算——对短上下文的小模型，
这点多余的计算远比省下的 Python 开销便宜。
"""

from __future__ import annotations

import torch

from .._checks import positive_int

__all__ = ["StaticLayerCache", "StaticKVCache"]


class StaticLayerCache:
    """一块自注意力的静态缓存：``k``、``v`` 各 ``(B, h_kv, L, d_k)``，在 :meth:`update` 里原地写入。

    它的接口与 :class:`~tformer_lib.AttentionCache` 相同（``static``、``k``、``v``、``key_length``、``update``），
    所以 :class:`~tformer_lib.MultiHeadAttention` 不用改一行就能用它。注意名字的冲突：
    ``AttentionCache.static`` 表示“交叉注意力、K/V 不再追加”，与这里的“预分配”无关，所以它是 False。
    """

    static = False  # 对 MultiHeadAttention 而言这是一个自注意力缓存：每步送来新的 K、V

    def __init__(self, owner: "StaticKVCache", k: torch.Tensor, v: torch.Tensor):
        self.owner = owner
        self.k = k  # (B, h_kv, L, d_k)
        self.v = v  # (B, h_kv, L, d_k)

    def key_length(self, new: int) -> int:
        """:meth:`update` 总是返回整个缓存：T_k 是槽位数 L。"""
        return self.k.shape[2]

    def cached_length(self) -> int:
        """按槽位写入的缓存说不出“已缓存到第几个位置”（哪些槽位有效由掩码决定）：调用者要显式给出位置。"""
        raise ValueError("StaticLayerCache 按槽位写入，没有“已缓存的长度”：请给 MultiHeadAttention 显式的 positions")

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """把新位置的 ``k``、``v`` ``(B, h_kv, T, d_k)`` 写进第 ``owner.slots`` 个槽位，返回整个缓存。"""
        slots = self.owner.slots  # (T,)
        self.k.index_copy_(2, slots, k)  # 原地写入：self.k[:, :, slots] = k
        self.v.index_copy_(2, slots, v)
        return self.k, self.v  # (B, h_kv, L, d_k)：没写过的槽位由掩码屏蔽


class StaticKVCache:
    """整个模型的静态缓存：每块一个 :class:`StaticLayerCache`，外加这一步要写入的槽位 ``slots``。

    - ``batch``：批大小 B（一个缓存服务固定的 B；换批大小就新建一个）；
    - ``max_len``：槽位数 L，默认模型的上下文长度 ``config.max_len``；
    - 字节数 = 2（K 与 V）× N 块 × B × h_kv × L × d_k × 每元素字节，开始时就全部分配（:meth:`nbytes`）。
    """

    def __init__(self, model, batch: int, max_len: int | None = None):
        config = getattr(model, "config", None)
        if config is None or not hasattr(model, "blocks"):
            raise TypeError(f"model 应是 DecoderOnlyLM，收到 {type(model).__name__}")
        if config.positional == "alibi":
            raise ValueError("静态缓存不支持 positional='alibi'：ALiBi 按槽位数距离，这里的槽位是预分配的；"
                             "请用 tformer_lib.lm.generate（普通的 K/V 缓存）")
        positive_int("batch", batch)
        max_len = config.max_len if max_len is None else positive_int("max_len", max_len)
        if max_len > config.max_len:
            raise ValueError(f"max_len={max_len} 超过了模型的上下文长度 config.max_len={config.max_len}")
        weight = model.lm_head.weight
        shape = (batch, config.kv_heads, max_len, config.d_k)  # (B, h_kv, L, d_k)
        self.batch, self.max_len = batch, max_len
        self.layers = [
            StaticLayerCache(self, torch.zeros(shape, dtype=weight.dtype, device=weight.device),
                             torch.zeros(shape, dtype=weight.dtype, device=weight.device))
            for _ in model.blocks
        ]
        self.slots = torch.zeros(1, dtype=torch.long, device=weight.device)  # (T,) 本步写入哪些槽位

    def reset(self) -> None:
        """清零全部 K、V（新的一批请求开始前；不清也不影响结果，因为掩码只放行已写入的槽位）。"""
        for layer in self.layers:
            layer.k.zero_()
            layer.v.zero_()

    def nbytes(self) -> int:
        """K 与 V 一共占多少字节（预分配的全部 L 个槽位）。"""
        return sum(t.numel() * t.element_size() for layer in self.layers for t in (layer.k, layer.v))
