"""nbval 的笔记本内核改用 Unix 套接字（IPC），并把内核的标准错误记进日志。

`scripts/test_installed.sh` 把本文件复制成每条指令集通道的 `conftest.py`（通道目录里只有笔记本副本）。

为什么：三条通道并行时，各自的 nbval 每个笔记本都启动一个内核。jupyter_client 默认用 TCP：先找几个空闲端口、
关掉，再把端口号写进连接文件交给内核；在这中间，另一条通道的内核（或第 12 章的 gloo 进程）可能先占了同一个端口，
内核绑不上就退出，nbval 只报 “Kernel died before replying to kernel_info”（2026-12-04 的 CI 在
04_solutions 上遇到一次）。IPC 的套接字是每个内核自己的临时目录里的文件，不和任何进程抢端口。
nbval 把内核的标准错误丢进 /dev/null；这里改写到通道目录的 kernel-stderr.log，内核再出事时能看到原因。
"""

import tempfile
from pathlib import Path

import nbval.kernel
from jupyter_client.manager import KernelManager

LANE = Path(__file__).resolve().parent


class IPCKernelManager(KernelManager):
    """transport="ipc" 的 KernelManager：套接字放在通道目录下一个新建的临时目录里（路径要短于 Unix 套接字的 107 字节）。"""

    def __init__(self, **kwargs):
        sockets = Path(tempfile.mkdtemp(prefix="k", dir=LANE / "ipc")) / "kernel"
        super().__init__(transport="ipc", ip=str(sockets), **kwargs)

    def start_kernel(self, **kwargs):
        with open(LANE / "kernel-stderr.log", "a") as log:  # 子进程继承一份，父进程这份用完即关
            kwargs["stderr"] = log
            return super().start_kernel(**kwargs)


(LANE / "ipc").mkdir(exist_ok=True)
nbval.kernel.KernelManager = IPCKernelManager
