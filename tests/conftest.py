"""测试公共设置：单线程（2 核机器上与其他进程并行时单线程更稳）与固定种子。"""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
