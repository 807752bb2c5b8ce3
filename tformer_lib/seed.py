"""可复现性（reproducibility）：一次设定 Python、NumPy 与 PyTorch 的随机种子。"""

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
