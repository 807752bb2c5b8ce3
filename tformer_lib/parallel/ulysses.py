r"""DeepSpeed-Ulysses（上下文并行的另一种，第 16 章）：用两次 all-to-all 把“按序列切”换成“按头切”再换回来。

每个进程持有按顺序切给它的一片序列、全部 h 个头：``(B, h, T/p, d)``。注意力的每个头互不相干，所以：

1. all-to-all：把第 g 组 h/p 个头发给进程 g，收到的是各进程那片序列的同一组头——拼起来是 **整条序列、h/p 个头**
   ``(B, h/p, T, d)``；
2. 本地做普通的（因果）注意力，任何注意力实现都行（这里用库里的 :func:`~tformer_lib.scaled_dot_product_attention`）；
3. all-to-all 换回 ``(B, h, T/p, d)``。

与环形注意力相比：通信量与 p 无关地小（每个进程每次 all-to-all 交出自己的 q/k/v/输出各一份），但并行度被头数限住
（p 须整除 h；这里的实现要求 q、k、v 的头数相同，GQA 的模型先把 K/V 头复制到 h 个），而且每个进程要放得下整条序列的 ``(T, T)`` 分数（或用 FlashAttention 避免）。
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .._checks import positive_int
from ..parts.attention import scaled_dot_product_attention
from ..parts.masks import causal_mask
from .all_to_all import AllToAll
from .ring_attention import check_local_qkv

__all__ = ["ulysses_attention", "sequence_to_heads", "heads_to_sequence", "ulysses_payload"]


def sequence_to_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, h, T/p, d)``（按序列切）→ ``(B, h/p, T, d)``（按头切）：一次带梯度的 all-to-all。"""
    p = dist.get_world_size()
    b, h, n, d = x.shape
    groups = x.reshape(b, p, h // p, n, d).transpose(0, 1)  # (p, B, h/p, n, d)：第 g 组头发给进程 g
    received = AllToAll.apply(groups.contiguous(), [1] * p, [1] * p)  # (p, B, h/p, n, d)：第 q 个来自进程 q
    return received.permute(1, 2, 0, 3, 4).reshape(b, h // p, p * n, d)  # (B, h/p, T, d)：按来源顺序就是序列顺序


def heads_to_sequence(x: torch.Tensor) -> torch.Tensor:
    """:func:`sequence_to_heads` 的逆：``(B, h/p, T, d)`` → ``(B, h, T/p, d)``。"""
    p = dist.get_world_size()
    b, h_local, t, d = x.shape
    pieces = x.reshape(b, h_local, p, t // p, d).permute(2, 0, 1, 3, 4)  # (p, B, h/p, n, d)：第 q 片序列发回进程 q
    received = AllToAll.apply(pieces.contiguous(), [1] * p, [1] * p)  # (p, B, h/p, n, d)：第 g 组头来自进程 g
    return received.transpose(0, 1).reshape(b, p * h_local, t // p, d)  # (B, h, n, d)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True) -> torch.Tensor:
    """本进程持有按顺序切给它的 ``q``、``k``、``v`` ``(B, h, T/p, d)``，返回本进程那片的注意力输出 ``(B, h, T/p, d)``，
    与整条序列一次注意力的对应行相同（前向与反向）。p 须整除头数 h。需要已初始化的进程组。"""
    check_local_qkv("ulysses_attention", q, k, v, causal)
    p = dist.get_world_size()
    if q.shape[1] % p != 0:
        raise ValueError(f"头数 h={q.shape[1]} 不能被进程数 p={p} 整除：Ulysses 按头分给各进程")
    q_h, k_h, v_h = (sequence_to_heads(x) for x in (q, k, v))  # 各 (B, h/p, T, d)
    mask = causal_mask(q_h.shape[-2]).to(q.device) if causal else None  # (T, T)
    out, _ = scaled_dot_product_attention(q_h, k_h, v_h, mask)  # (B, h/p, T, d)
    return heads_to_sequence(out)  # (B, h, T/p, d)


def ulysses_payload(batch: int, heads: int, local_len: int, d_head: int, element_bytes: int = 4) -> dict[str, int]:
    r"""一次 Ulysses 注意力每个进程交给 all-to-all 的字节（含留给自己的 1/p）：一份 = :math:`B\,h\,(T/p)\,d\,b`。

    前向：q、k、v 各一次 + 输出一次 = 4 份；反向：四次 all-to-all 各把梯度送回一次 = 4 份。其中发往别的进程的占 (p−1)/p。
    """
    for name, value in (("batch", batch), ("heads", heads), ("local_len", local_len), ("d_head", d_head),
                        ("element_bytes", element_bytes)):
        positive_int(name, value)
    share = batch * heads * local_len * d_head * element_bytes
    return {"forward": 4 * share, "backward": 4 * share}
