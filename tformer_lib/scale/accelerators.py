"""账本里用到的加速卡：显存、HBM 带宽与稠密 bf16 算力，全部取自厂商的数据手册（datasheet），不是实测。

* A100 80GB SXM：HBM2e 2,039 GB/s；BF16 Tensor Core 312 TFLOPS（数据手册另列“624 TFLOPS*”是 2:4 稀疏的数）。
  出处：NVIDIA A100 Tensor Core GPU 数据手册，https://www.nvidia.com/en-us/data-center/a100/
* H100 SXM（80 GB）：HBM3 3.35 TB/s；数据手册写 BF16 Tensor Core 1,979 TFLOPS，脚注说明这是带稀疏的数，
  稠密取一半 989.5 TFLOPS。出处：NVIDIA H100 Tensor Core GPU 数据手册，https://www.nvidia.com/en-us/data-center/h100/
* H200 SXM（141 GB）：HBM3e 4.8 TB/s；算力与 H100 SXM 相同（1,979 TFLOPS 带稀疏，稠密 989.5）。
  出处：NVIDIA H200 Tensor Core GPU 数据手册，https://www.nvidia.com/en-us/data-center/h200/

厂商的 GB、TB 是十进制（1 GB = 10⁹ 字节）；峰值是理论值，实际能跑到的带宽与算力通常只有它的六到九成。
"""

from __future__ import annotations

__all__ = ["ACCELERATORS", "GB"]

GB = 10**9  # 厂商口径的 GB（十进制）

#: 名字 → ``memory_bytes``（显存）、``bandwidth``（HBM 字节/秒）、``bf16_flops``（稠密 bf16 峰值 FLOP/s）、``source``
ACCELERATORS: dict[str, dict] = {
    "A100-80GB-SXM": {"memory_bytes": 80 * GB, "bandwidth": 2.039e12, "bf16_flops": 312e12,
                      "source": "https://www.nvidia.com/en-us/data-center/a100/"},
    "H100-SXM": {"memory_bytes": 80 * GB, "bandwidth": 3.35e12, "bf16_flops": 989.5e12,
                 "source": "https://www.nvidia.com/en-us/data-center/h100/"},
    "H200-SXM": {"memory_bytes": 141 * GB, "bandwidth": 4.8e12, "bf16_flops": 989.5e12,
                 "source": "https://www.nvidia.com/en-us/data-center/h200/"},
}
