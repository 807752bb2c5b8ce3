"""张量并行（tensor parallelism，Megatron-LM 的切法）：一层的矩阵切到 p 个进程上，每个进程只存、只算 1/p。

前馈网络 FFN(x) = W_2 φ(W_1 x + b_1) + b_2：

- W_1 按**列**切（column-parallel，输出特征分给各进程）：rank r 算 h_r = φ(x W_1[:, r]ᵀ + b_1[r])，不需要通信——
  φ 逐元素，作用在各自的那几列上即可；
- W_2 按**行**切（row-parallel，输入特征分给各进程）：rank r 算部分和 y_r = h_r W_2[r]ᵀ，
  一次 all-reduce 得 y = Σ_r y_r，再加一次 b_2。

注意力同理：W^Q、W^K、W^V 按列切 = 每个进程拿 h/p 个完整的头（头与头之间本来就不通信），W^O 按行切 + 一次 all-reduce。
前向一次 all-reduce 的“镜像”在反向：输入 x 的梯度是各进程部分梯度之和，所以入口处要在反向时 all-reduce
（Megatron 论文的 f / g 两个算子：:class:`CopyToParallel` / :class:`ReduceFromParallel`）。

同一个切法也用 PyTorch 的 ``torch.distributed.tensor.parallel`` 写一遍（``ColwiseParallel``/``RowwiseParallel``：
FFN 用 :func:`torch_parallelize_ffn`，注意力用 :func:`torch_parallelize_attention`）；测试证明两者都与不切的模块
训练 k 步后一致（SGD 6 步，参数差 ≤ 1e-6，实测约 3e-8；30 步也还是 3e-8），每步交给 all-reduce 的字节也与
手写的相同（:func:`~tformer_lib.parallel.comm.recording_torch_collectives` 记下 PyTorch 自己发起的通信）。

一个坑（它曾让 PyTorch 路径从第 2 步起偏离 ~1e-2）：``spawn`` 出来的进程收到的参数张量（``launch`` 的 ``args``）
经 ``torch.multiprocessing`` 放进**共享内存**——两个进程拿到的是同一块存储。谁原地更新它（``optimizer.step()``），
另一个进程的“副本”也跟着变，于是复制的参数（不切的注意力、``Replicate`` 的偏置 b_2）每步被更新 p 次，且两个进程
读写交错、每次运行结果不同；分片的参数是新分配的内存，不受影响，所以只有第一步（更新之前）一致。worker 里先
:func:`~tformer_lib.parallel.tensor_parallel_workers.private_copy` 一份再用。
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .._checks import non_negative_int, positive_int
from ..parts.attention import MultiHeadAttention, scaled_dot_product_attention
from ..parts.feedforward import PositionwiseFeedForward
from .comm import record

__all__ = ["CopyToParallel", "ReduceFromParallel", "column_shard", "row_shard", "TensorParallelFFN",
           "TensorParallelAttention", "ResidualBlock", "torch_parallelize_ffn", "torch_parallelize_attention",
           "TP_MODES"]

#: 张量并行的写法："manual" 手写切注意力与 FFN；"torch" 只把 FFN 交给 PyTorch；"torch_block" 注意力与 FFN 都交给 PyTorch
TP_MODES = ("manual", "torch", "torch_block")


def _require_process_group() -> None:
    """手写切法的 all-reduce 要在进程组里做：否则给中文的说明，而不是 torch 的英文报错。"""
    if not dist.is_initialized():
        raise RuntimeError("手写张量并行的 all-reduce 需要先有进程组：在 launch 起的进程里（或 torchrun 下）"
                           "运行 TensorParallelFFN / TensorParallelAttention；单进程时直接用原来的模块")


class CopyToParallel(torch.autograd.Function):
    """Megatron 的 f：前向原样复制（每个进程都有完整的 x），反向把各进程对 x 的部分梯度 all-reduce 求和。"""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        record("all_reduce", grad)
        _require_process_group()
        dist.all_reduce(grad)
        return grad


class ReduceFromParallel(torch.autograd.Function):
    """Megatron 的 g：前向把部分和 all-reduce 成完整的输出，反向原样传回（每个进程都需要完整的梯度）。"""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous().clone()
        record("all_reduce", x)
        _require_process_group()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def _chunk(size: int, name: str, rank: int, world_size: int) -> slice:
    positive_int("world_size", world_size)
    rank = non_negative_int("rank", rank)
    if rank >= world_size:
        raise ValueError(f"rank 应是 0 到 world_size-1={world_size - 1} 之间的整数，收到 {rank!r}")
    if size % world_size != 0:
        raise ValueError(f"{name}={size} 不能被进程数 world_size={world_size} 整除，无法均分到各进程")
    part = size // world_size
    return slice(rank * part, (rank + 1) * part)


def _linear(linear) -> None:
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"linear 应是 nn.Linear，收到 {type(linear).__name__}")


def _mesh(module: nn.Module, world_size: int):
    """PyTorch 路径的一维设备网格（device mesh）：要求已在进程组里，且 ``world_size`` 与进程数相同。"""
    from torch.distributed.device_mesh import init_device_mesh

    positive_int("world_size", world_size)
    if not dist.is_initialized():
        raise RuntimeError("PyTorch 的张量并行需要先有进程组：在 launch 起的进程里（或 torchrun 下）调用")
    if world_size != dist.get_world_size():
        raise ValueError(f"world_size={world_size} 与进程组的进程数 {dist.get_world_size()} 不同")
    return init_device_mesh(next(module.parameters()).device.type, (world_size,))


def column_shard(linear: nn.Linear, rank: int, world_size: int, name: str = "out_features") -> nn.Linear:
    """按列切（输出特征）：新的 ``nn.Linear(in, out/p)``，权重是 ``weight[r 份, :]``、偏置 ``bias[r 份]`` 的副本。"""
    _linear(linear)
    rows = _chunk(linear.out_features, name, rank, world_size)
    shard = nn.Linear(linear.in_features, rows.stop - rows.start, bias=linear.bias is not None)
    with torch.no_grad():
        shard.weight.copy_(linear.weight[rows])  # (out/p, in)
        if linear.bias is not None:
            shard.bias.copy_(linear.bias[rows])
    return shard


def row_shard(linear: nn.Linear, rank: int, world_size: int, name: str = "in_features") -> tuple[nn.Linear, nn.Parameter | None]:
    """按行切（输入特征）：无偏置的 ``nn.Linear(in/p, out)`` 加上完整偏置（all-reduce 之后只加一次）。"""
    _linear(linear)
    cols = _chunk(linear.in_features, name, rank, world_size)
    shard = nn.Linear(cols.stop - cols.start, linear.out_features, bias=False)
    with torch.no_grad():
        shard.weight.copy_(linear.weight[:, cols])  # (out, in/p)
    bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None
    return shard, bias


class TensorParallelFFN(nn.Module):
    """由完整的 :class:`~tformer_lib.PositionwiseFeedForward` 切出 rank 的那一份；前向一次 all-reduce。"""

    def __init__(self, ffn: PositionwiseFeedForward, rank: int, world_size: int):
        super().__init__()
        if not isinstance(ffn, PositionwiseFeedForward):
            raise TypeError(f"ffn 应是 PositionwiseFeedForward，收到 {type(ffn).__name__}")
        self.w_1 = column_shard(ffn.w_1, rank, world_size, "d_ff")
        self.w_3 = column_shard(ffn.w_3, rank, world_size, "d_ff") if ffn.w_3 is not None else None
        self.w_2, self.b_2 = row_shard(ffn.w_2, rank, world_size, "d_ff")
        self.activation = ffn.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = CopyToParallel.apply(x)  # (B, T, d_model)：反向时 all-reduce x 的梯度
        hidden = self.activation(self.w_1(x))  # (B, T, d_ff/p)：列切，无通信
        if self.w_3 is not None:
            hidden = hidden * self.w_3(x)  # (B, T, d_ff/p)
        partial = self.w_2(hidden)  # (B, T, d_model)：行切，只是部分和
        return ReduceFromParallel.apply(partial) + self.b_2  # (B, T, d_model)：一次 all-reduce，偏置加一次


class TensorParallelAttention(nn.Module):
    """由完整的 :class:`~tformer_lib.MultiHeadAttention` 切出 rank 的 h/p 个头（只支持自注意力、普通 MHA）。"""

    def __init__(self, attn: MultiHeadAttention, rank: int, world_size: int):
        super().__init__()
        if not isinstance(attn, MultiHeadAttention):
            raise TypeError(f"attn 应是 MultiHeadAttention，收到 {type(attn).__name__}")
        if attn.n_kv_heads != attn.n_heads or attn.rope or attn.alibi:
            raise ValueError("TensorParallelAttention 只演示普通多头注意力（n_kv_heads = n_heads、不用 RoPE 或 ALiBi）")
        _chunk(attn.n_heads, "n_heads", rank, world_size)
        self.n_heads, self.d_k = attn.n_heads // world_size, attn.d_k
        self.w_q = column_shard(attn.w_q, rank, world_size, "d_model")  # 列切 = 连续的 h/p 个头
        self.w_k = column_shard(attn.w_k, rank, world_size, "d_model")
        self.w_v = column_shard(attn.w_v, rank, world_size, "d_model")
        self.w_o, self.b_o = row_shard(attn.w_o, rank, world_size, "d_model")

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.d_k).transpose(1, 2)  # (B, h/p, T, d_k)

    def forward(self, query, key=None, value=None, mask=None) -> torch.Tensor:
        if (key is not None and key is not query) or (value is not None and value is not query):
            raise ValueError("TensorParallelAttention 只支持自注意力：key、value 应省略或就是 query")
        x = CopyToParallel.apply(query)  # (B, T, d_model)
        q, k, v = self._heads(self.w_q(x)), self._heads(self.w_k(x)), self._heads(self.w_v(x))  # 各 (B, h/p, T, d_k)
        out, _ = scaled_dot_product_attention(q, k, v, mask)  # (B, h/p, T, d_k)：本进程的头各自算
        batch, _, length, _ = out.shape
        out = out.transpose(1, 2).reshape(batch, length, self.n_heads * self.d_k)  # (B, T, d_model/p)
        return ReduceFromParallel.apply(self.w_o(out)) + self.b_o  # (B, T, d_model)


class ResidualBlock(nn.Module):
    """测试与第 12 章用的最小块：``h = x + attn(x)``，``y = h + ffn(h)``（不切与切开的版本共用这一个前向）。"""

    def __init__(self, attn: nn.Module, ffn: nn.Module):
        super().__init__()
        self.attn, self.ffn = attn, ffn

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = x + self.attn(x, x, x, mask)  # (B, T, d_model)
        return h + self.ffn(h)  # (B, T, d_model)


def torch_parallelize_ffn(ffn: PositionwiseFeedForward, world_size: int) -> PositionwiseFeedForward:
    """同一个 Megatron 切法交给 PyTorch：``w_1``（与 SwiGLU 的 ``w_3``）``ColwiseParallel``，``w_2`` ``RowwiseParallel``。

    原地改造 ``ffn``：它的参数变成 ``DTensor``（每个进程存 1/p），前向里 PyTorch 自己在 ``w_2`` 之后插入那一次
    all-reduce，反向在 FFN 入口对 x 的梯度一次 all-reduce（入口由 ``PrepareModuleInput`` 统一换成 DTensor）。
    """
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module

    if not isinstance(ffn, PositionwiseFeedForward):
        raise TypeError(f"ffn 应是 PositionwiseFeedForward，收到 {type(ffn).__name__}")
    _chunk(ffn.w_1.out_features, "d_ff", 0, world_size)
    mesh = _mesh(ffn, world_size)
    plan = {"w_1": ColwiseParallel(), "w_2": RowwiseParallel()}
    if ffn.w_3 is not None:
        plan["w_3"] = ColwiseParallel()
    parallelize_module(ffn, mesh, plan)
    # 入口只换一次：x 在 FFN 入口就变成 Replicate 的 DTensor，w_1 与 w_3 共用它，反向时两份部分梯度先在 DTensor
    # 上相加，再一次 all-reduce（Megatron 的一个 f）。若让 w_1、w_3 各自从本地张量进入，SwiGLU 每步会多一次。
    return parallelize_module(ffn, mesh, PrepareModuleInput(input_layouts=(Replicate(),),
                                                            desired_input_layouts=(Replicate(),),
                                                            use_local_output=False))


def torch_parallelize_attention(attn: MultiHeadAttention, world_size: int) -> MultiHeadAttention:
    """注意力的同一个切法交给 PyTorch：``w_q``/``w_k``/``w_v`` ``ColwiseParallel``（按列切 = 每个进程 h/p 个头），
    ``w_o`` ``RowwiseParallel``（输入按最后一维切，输出一次 all-reduce）。原地改造 ``attn``，模块代码一行不改。

    难点在形状：``MultiHeadAttention`` 按 ``n_heads``、``d_model`` 拆头与拼头（``view(B, T, h, d_k)``）。若像 FFN
    那样让 Colwise 交回本地张量（``use_local_output=True``），本地只有 d_model/p 列，拆成 h 个头就错了。这里改让
    Q/K/V 保持 ``DTensor``（``use_local_output=False``，布局 ``Shard(-1)``）：模块看到的是**全局**形状，
    ``view``/``transpose`` 由 DTensor 把“切在最后一维”换算成“切在头那一维”，每个进程实际只算自己的 h/p 个头
    （``attn.attn_weights`` 是 ``DTensor``，本地形状 ``(B, h/p, T_q, T_k)``，``full_tensor()`` 拼回完整的）。
    为此进入模块前把 query/key/value/mask 都包成 ``Replicate`` 的 DTensor（前向预钩子，作用同
    ``PrepareModuleInput``，但也接受 ``mask=None``；同一个张量只包一次）；它在反向把各进程对输入的部分梯度
    all-reduce 求和（Megatron 的 f）。

    只支持显式路径的普通多头自注意力（``fast=False``、``n_kv_heads = n_heads``、不用 RoPE、dropout 为 0）：
    torch 2.13 的 DTensor 在 CPU 上没有 SDPA 快速路径可用，RoPE 的 cos/sin 是普通张量，不能与 DTensor 混算。
    """
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if not isinstance(attn, MultiHeadAttention):
        raise TypeError(f"attn 应是 MultiHeadAttention，收到 {type(attn).__name__}")
    if attn.n_kv_heads != attn.n_heads or attn.rope or attn.alibi or attn.fast or attn.dropout.p != 0:
        raise ValueError("torch_parallelize_attention 只支持显式路径的普通多头注意力（fast=False、n_kv_heads = n_heads、"
                         f"不用 RoPE、dropout=0），收到 fast={attn.fast}、n_kv_heads={attn.n_kv_heads}、"
                         f"n_heads={attn.n_heads}、rope={attn.rope}、alibi={attn.alibi}、dropout={attn.dropout.p}")
    _chunk(attn.n_heads, "n_heads", 0, world_size)
    mesh = _mesh(attn, world_size)
    plan = {name: ColwiseParallel(use_local_output=False) for name in ("w_q", "w_k", "w_v")}  # 输出 Shard(-1)
    plan["w_o"] = RowwiseParallel(input_layouts=Shard(-1))  # 输出 Replicate，交回本地张量

    def to_dtensors(module, args, kwargs):
        made = {}  # 自注意力里 query、key、value 是同一个张量：只包一次，反向只 all-reduce 一次

        def replicate(value):
            if not isinstance(value, torch.Tensor) or isinstance(value, DTensor):
                return value
            if id(value) not in made:
                made[id(value)] = DTensor.from_local(value, mesh, (Replicate(),), run_check=False)  # 每个进程完整一份
            return made[id(value)]

        return tuple(replicate(a) for a in args), {k: replicate(v) for k, v in kwargs.items()}

    attn = parallelize_module(attn, mesh, plan)
    attn.register_forward_pre_hook(to_dtensors, with_kwargs=True)
    return attn
