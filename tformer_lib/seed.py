"""可复现性（reproducibility）：一次设定 Python、NumPy 与 PyTorch 的随机种子；以及逐位复现成立的范围——同一个 CPU 指纹。"""

import platform
import random

import numpy as np
import torch


def set_seed(seed: int = 0) -> None:
    """为 ``random``、``numpy`` 与 ``torch`` 设定同一个随机种子。

    在 CPU 上，同一台机器、同样的线程数下，设定种子后的训练与采样逐位可复现。
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed 应是非负整数，收到 {seed!r}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def cpu_fingerprint() -> str:
    """CPU 型号与 torch 选用的指令集（如 ``"AMD EPYC | AVX2"``）：浮点结果逐位可复现只在同一指纹下成立。

    随包检查点与结果文件都记下它（结果文件里在 :func:`~tformer_lib.measurement.benchmarking.machine_info` 的 ``cpu`` 项）。
    """
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model} | {torch.backends.cpu.get_cpu_capability()}"
