"""分布式训练（第 12 章）：一个方案一个小模块，都建在 ``torch.distributed`` 上（CPU 用 gloo，CUDA 用 nccl）。

- :mod:`.launch`：起进程、组进程组（空闲端口、超时、永不挂起）；常驻进程组 ``WorkerPool``；``torchrun`` 下的初始化；
- :mod:`.data_parallel`：手写梯度 all-reduce → ``DistributedDataParallel``；``DistributedSampler``；
- :mod:`.tensor_parallel`：Megatron 切法（注意力按头、FFN 列切→行切，各一次 all-reduce）手写与 ``torch.distributed.tensor.parallel``；
  :mod:`.tensor_parallel_workers`：切开训练、与不切的块比较的进程函数；
- :mod:`.pipeline`：2 段流水线，手写 GPipe（send/recv）与 ``torch.distributed.pipelining`` 的 GPipe/1F1B；气泡 (p−1)/(m+p−1)；
- :mod:`.zero` / :mod:`.fsdp`：ZeRO 阶段 0–3 每进程字节公式；FSDP2 ``fully_shard`` 训练并量出每进程实际字节；
- :mod:`.comm`：每种方案每步的通信载荷，由手写方案实际交出的张量记下（PyTorch 的张量并行与 FSDP2 自己发起的通信，
  由同一模块里的两个 dispatch 记录器记下），与公式（环形 all-reduce 2(p−1)/p 等）比较；
- :mod:`.throughput`：同一次运行里量 1 进程 × 2 线程 与 2 进程 × 1 线程（数据并行）的词元/秒与通信占比；
- :mod:`.trainer`：``torchrun`` 下的 ``lm-train``（``LMTrainer`` + DDP，只有 rank 0 打印与保存）；
- 第 16 章：:mod:`.all_to_all`（带梯度的 all-to-all）、:mod:`.expert_parallel`（专家分到各进程，词元 all-to-all 过去
  再送回）、:mod:`.ring_attention`（K/V 块绕环走一圈，在线 softmax 合并；之字形切片均衡因果的工作量）、
  :mod:`.ulysses`（all-to-all 把按序列切换成按头切）。

每个手写方案都有测试证明它与单进程训练、也与 PyTorch 自己的引擎结果一致。
"""

from .launch import DistributedError, WorkerPool, backend_for, init_from_env, is_rank0, launch, rank_print
from .data_parallel import allreduce_gradients, rank_batches, train_data_parallel, train_single_process
from .trainer import DistributedLMTrainer
from .zero import zero_bytes_per_rank
from .pipeline import bubble_fraction
