r"""环形注意力（ring attention，上下文并行 context parallelism 的一种，第 16 章）。

序列长 T 切成 p 片，每个进程持有自己那片的 q、k、v ``(B, h, T/p, d)``。K/V 块绕着进程环走一圈：第 s 步，
进程 r 手里是进程 (r − s) mod p 的 K/V 块，用第 8 章的在线 softmax 把这一块并入自己的运行量
（最大值 m、分母 l、累加器 acc），同时把这一块传给下一个进程。走完一圈，每个查询都见过了全部的键——
结果与整条序列一次注意力完全相同，而任何进程都没有持有过整条序列的 K/V 或 ``(T, T)`` 的分数表。

反向同样绕环：K/V 块带着自己的梯度累加器 dK、dV 再走一圈（p 次传递，最后回到主人手里），每个进程按
FlashAttention 的反向公式（用前向存下的 logsumexp 重算概率）把自己对这一块的贡献加进去。

因果掩码下，按顺序切片（``layout="contiguous"``）时最后一个进程的查询要看全部的键、第一个只看自己那片：
工作量不均。之字形切片（``layout="zigzag"``）把序列切成 2p 块，进程 r 拿第 r 块与第 2p−1−r 块，
每个进程要算的（查询, 键）对数完全相同（:func:`causal_pairs`）。
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .._checks import one_of, positive_int
from .comm import record

__all__ = ["LAYOUTS", "sequence_positions", "split_sequence", "gather_sequence", "causal_pairs", "ring_attention",
           "check_local_qkv", "same_local_length",
           "RingAttention", "ring_attention_payload", "ring_attention_saved_bytes"]

#: 序列的切法："contiguous" = 按顺序切 p 片；"zigzag" = 切 2p 块，进程 r 拿第 r 与第 2p−1−r 块
LAYOUTS = ("contiguous", "zigzag")


def sequence_positions(seq_len: int, world_size: int, layout: str = "zigzag") -> list[torch.Tensor]:
    """每个进程持有的全局位置 ``[(T/p,) × p]``（升序）。``seq_len`` 须能被 p（之字形：2p）整除。"""
    positive_int("seq_len", seq_len)
    positive_int("world_size", world_size)
    one_of("layout", layout, LAYOUTS)
    pieces = world_size if layout == "contiguous" else 2 * world_size
    if seq_len % pieces != 0:
        raise ValueError(f"layout={layout!r} 要求 seq_len 能被 {pieces} 整除，收到 seq_len={seq_len}、world_size={world_size}")
    chunks = torch.arange(seq_len).chunk(pieces)
    if layout == "contiguous":
        return list(chunks)
    return [torch.cat([chunks[r], chunks[pieces - 1 - r]]) for r in range(world_size)]


def split_sequence(x: torch.Tensor, positions: list[torch.Tensor], dim: int = -2) -> list[torch.Tensor]:
    """按 :func:`sequence_positions` 把 ``x`` 沿序列维 ``dim`` 切给各进程。"""
    total = sum(len(pos) for pos in positions)
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[dim] != total:
        raise ValueError(f"x 沿 dim={dim} 的长度应是 positions 的总长 {total}，收到形状 {tuple(getattr(x, 'shape', ()))}")
    return [x.index_select(dim, pos) for pos in positions]


def gather_sequence(parts: list[torch.Tensor], positions: list[torch.Tensor], dim: int = -2) -> torch.Tensor:
    """:func:`split_sequence` 的逆：各进程的片按全局位置拼回整条序列。"""
    order = torch.cat(positions)  # (T,)：拼起来后第 i 行是全局位置 order[i]
    return torch.cat(parts, dim=dim).index_select(dim, torch.argsort(order))


def causal_pairs(seq_len: int, world_size: int, layout: str = "zigzag") -> list[int]:
    """因果掩码下每个进程要算的（查询, 键）对数：位置为 t 的查询看 t + 1 个键，对本进程的查询求和。"""
    return [int((pos + 1).sum()) for pos in sequence_positions(seq_len, world_size, layout)]


def _pass_to_next(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """把 ``tensors`` 发给环上的下一个进程，同时收上一个进程发来的同形状张量。"""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:  # 环上只有自己
        return tensors
    received = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]  # 连续的接收缓冲
    requests = []
    for t, r in zip(tensors, received):
        record("send", t)
        requests.append(dist.isend(t.contiguous(), (rank + 1) % p))
        requests.append(dist.irecv(r, (rank - 1) % p))
    for request in requests:
        request.wait()
    return received


def _scores(q, k, q_pos, k_pos, causal: bool, scale: float) -> torch.Tensor:
    s = q @ k.transpose(-2, -1) * scale  # (B, h, n, n)：本地查询 × 这一块的键
    if causal:
        later = (k_pos[None, :] > q_pos[:, None]).to(s.device)  # (n, n)：键的全局位置晚于查询
        s = s.masked_fill(later, float("-inf"))  # 只看全局位置不晚于自己的键
    return s


class RingAttention(torch.autograd.Function):
    """``RingAttention.apply(q, k, v, layout, causal)``：见 :func:`ring_attention`。"""

    @staticmethod
    def forward(ctx, q, k, v, layout, causal):
        rank, p = dist.get_rank(), dist.get_world_size()
        positions = sequence_positions(q.shape[-2] * p, p, layout)
        scale = 1.0 / math.sqrt(q.shape[-1])
        m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)  # (B, h, n) 运行最大值
        l = torch.zeros(q.shape[:-1], dtype=q.dtype, device=q.device)  # (B, h, n) 运行分母
        acc = torch.zeros_like(q)  # (B, h, n, d) 累加器
        k_blk, v_blk = k, v
        for step in range(p):
            source = (rank - step) % p  # 这一块 K/V 的主人
            s = _scores(q, k_blk, positions[rank], positions[source], causal, scale)  # (B, h, n, n)
            m_new = torch.maximum(m, s.max(dim=-1).values)  # (B, h, n)
            base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)  # 整块被屏蔽时避免 -inf − -inf
            weights = torch.exp(s - base[..., None])  # (B, h, n, n)
            correction = torch.exp(m - base)  # (B, h, n)
            l = l * correction + weights.sum(dim=-1)
            acc = acc * correction[..., None] + weights @ v_blk  # (B, h, n, d)
            m = m_new
            if step < p - 1:
                k_blk, v_blk = _pass_to_next([k_blk, v_blk])
        out = acc / l[..., None]  # (B, h, n, d)；因果时第 0 步的对角线保证 l > 0
        lse = m + torch.log(l)  # (B, h, n)：每行的 log Σ e^s，反向重算概率用
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.causal = layout, causal
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        rank, p = dist.get_rank(), dist.get_world_size()
        positions = sequence_positions(q.shape[-2] * p, p, ctx.layout)
        scale = 1.0 / math.sqrt(q.shape[-1])
        delta = (d_out * out).sum(dim=-1)  # (B, h, n)：D_i = Σ_j dO_ij O_ij
        d_q = torch.zeros_like(q)
        k_blk, v_blk, dk_blk, dv_blk = k, v, torch.zeros_like(k), torch.zeros_like(v)
        for step in range(p):
            source = (rank - step) % p
            s = _scores(q, k_blk, positions[rank], positions[source], ctx.causal, scale)  # (B, h, n, n)
            prob = torch.exp(s - lse[..., None])  # (B, h, n, n)：与前向相同的注意力权重（被屏蔽处为 0）
            dv_blk = dv_blk + prob.transpose(-2, -1) @ d_out  # (B, h, n, d)
            d_prob = d_out @ v_blk.transpose(-2, -1)  # (B, h, n, n)
            d_s = prob * (d_prob - delta[..., None]) * scale  # (B, h, n, n)：softmax 的反向，再乘缩放
            d_q = d_q + d_s @ k_blk  # (B, h, n, d)
            dk_blk = dk_blk + d_s.transpose(-2, -1) @ q  # (B, h, n, d)
            # 第 p 次传递把每块与它累加满的梯度送回主人手里
            k_blk, v_blk, dk_blk, dv_blk = _pass_to_next([k_blk, v_blk, dk_blk, dv_blk])
        return d_q, dk_blk, dv_blk, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, layout: str = "zigzag",
                   causal: bool = True) -> torch.Tensor:
    """本进程持有按 ``layout`` 切给它的 ``q``、``k``、``v`` ``(B, h, T/p, d)``，返回本进程那片的注意力输出 ``(B, h, T/p, d)``，
    与整条序列一次 :math:`\\mathrm{softmax}(QK^\\top/\\sqrt{d})V`（``causal`` 时加因果掩码）的对应行相同，前向与反向都是。

    需要已初始化的进程组；p = 1 时就是普通的注意力。各进程的 ``T/p`` 须相同。
    """
    check_local_qkv("ring_attention", q, k, v, causal, layout)
    return RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), layout, causal)


def check_local_qkv(who: str, q, k, v, causal, layout: str | None = None) -> None:
    """上下文并行的入口（环形注意力、Ulysses）共用的检查：本进程的 ``q``、``k``、``v`` 是同形状的 4 维浮点张量
    ``(B, h, T/p, d)``，``layout``（给出时）与 ``causal`` 合法，进程组已初始化，各进程的 T/p 相同。"""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point():
            raise ValueError(f"{name} 应是 4 维浮点张量 (B, h, T/p, d)，收到 {getattr(x, 'shape', type(x).__name__)}")
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q、k、v 的形状应相同，收到 {tuple(q.shape)}、{tuple(k.shape)}、{tuple(v.shape)}")
    if layout is not None:
        one_of("layout", layout, LAYOUTS)
    if not isinstance(causal, bool):
        raise TypeError(f"causal 应是 bool，收到 {causal!r}")
    if not dist.is_initialized():
        raise RuntimeError(f"{who} 需要已初始化的进程组（例如在 tformer_lib.parallel.launch 起的进程里调用）")
    same_local_length("q", q.shape[-2], q.device)


def same_local_length(name: str, length: int, device: torch.device | str = "cpu") -> None:
    """各进程的本地序列长度 T/p 必须相同且 ≥ 1（否则环上传的块形状对不上，gloo 会直接让进程崩溃）：一次小的 all-gather 核对。"""
    if length < 1:
        raise ValueError(f"{name} 的本地序列长度 T/p 应 ≥ 1，收到 {length}")
    lengths = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(lengths, torch.tensor([length], dtype=torch.int64, device=device))
    if len({int(t) for t in lengths}) != 1:
        raise ValueError(f"各进程的本地序列长度 T/p 应相同，收到 {[int(t) for t in lengths]}（{name} 的倒数第二维）")


def ring_attention_payload(batch: int, heads: int, local_len: int, d_head: int, world_size: int,
                           element_bytes: int = 4) -> dict[str, int]:
    r"""一次环形注意力每个进程发出的字节：前向 K、V 各传 p − 1 次，反向 K、V、dK、dV 各传 p 次。

    一块 = :math:`B\,h\,(T/p)\,d\,b` 字节；``{"forward": 2(p−1)·块, "backward": 4p·块}``（p = 1 时什么都不传：都是 0）。与 T 成正比——
    不像张量并行那样与参数量有关；但每一步的传输可以与这一步的计算重叠，只要算一块的时间长于传一块。
    """
    for name, value in (("batch", batch), ("heads", heads), ("local_len", local_len), ("d_head", d_head),
                        ("world_size", world_size), ("element_bytes", element_bytes)):
        positive_int(name, value)
    block = batch * heads * local_len * d_head * element_bytes
    return {"forward": 2 * (world_size - 1) * block, "backward": 4 * world_size * block if world_size > 1 else 0}


def ring_attention_saved_bytes(batch: int, heads: int, local_len: int, d_head: int, element_bytes: int = 4) -> int:
    r"""前向为反向存下的字节（每个进程）：q、k、v、输出各 :math:`B h (T/p) d`，加 logsumexp :math:`B h (T/p)`。

    整条序列的显式注意力要存 :math:`B h T^2` 的概率；这里没有任何与 :math:`T^2` 成正比的项。
    """
    for name, value in (("batch", batch), ("heads", heads), ("local_len", local_len), ("d_head", d_head),
                        ("element_bytes", element_bytes)):
        positive_int(name, value)
    return (4 * d_head + 1) * batch * heads * local_len * element_bytes
