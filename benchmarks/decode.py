"""解码基准（随书唐诗模型，1 线程）：今天的 generate、编译的静态缓存路径、transformers 的 generate，批大小 1 与 16；
编译耗时、一步解码的时间分解、FLOP 与字节下限、编译路径上的推测解码。同一次运行里交替测量，报告中位数与四分位范围。

用法：python benchmarks/decode.py [--rounds 7] [--new-tokens 100] [--out tformer_lib/results/decode.json] [--quick]

这是 ``python -m tformer_lib.inference.benchmark`` 的薄包装；最后一行是
``compiled/generate = X×, compiled/transformers = Y×``。``--quick`` 是 CI 用的小规模版本（数字不作结论）。
"""

import sys

from tformer_lib.inference.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
