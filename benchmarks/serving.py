"""推理服务基准（随书唐诗模型）：静态 vs 连续批处理（吞吐、TTFT、TPOT、步数、分页缓存内存）、前缀缓存省下的预填充，
以及推测解码（另训的小草稿 / 目标的前几块）在 k = 1, 2, 4 下的接受率与加速比。同一次运行里交替测量，报告中位数与范围。

用法：python benchmarks/serving.py [--threads 1] [--requests 96] [--rounds 3] [--out tformer_lib/results/serving.json] [--quick]

这是 ``python -m tformer_lib.serving.benchmark`` 的薄包装。``--quick`` 是 CI 用的小规模版本：只验证两种批处理、
前缀缓存与推测解码的输出相同、流程能跑通（几秒；数字不作结论）。
"""

import sys

from tformer_lib.serving.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
