"""命令行的进度报告：终端里是 tqdm 进度条；输出被管道或重定向时，每完成一段打印一行。

长时间的命令（``evaluate --method beam``、``train``、``lm-train``）用它，免得读者面对几分钟的沉默。
进度写到标准错误，标准输出只留结果（方便 ``> result.txt``）。
"""

from __future__ import annotations

import sys
import time

__all__ = ["StageProgress", "stage"]


def stage(message: str, stream=None) -> None:
    """打印一行阶段说明（如“开始训练：8 个 epoch……”）到标准错误，立即刷新。"""
    print(message, file=stream if stream is not None else sys.stderr, flush=True)


class StageProgress:
    """``total`` 个单位的工作：``update(n)`` 报告又完成了 n 个，``close()`` 收尾。

    bar: True = tqdm 进度条；False = 每次 ``update`` 打印一行“desc：已完成/总数 单位（已用 … 秒）”；
    None（默认）= 标准错误是终端时用进度条，否则打印行。
    """

    def __init__(self, total: int, desc: str, unit: str = "", bar: bool | None = None, stream=None):
        self.total, self.desc, self.unit = int(total), desc, unit
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.start = time.perf_counter()
        use_bar = self.stream.isatty() if bar is None else bool(bar)
        self._bar = None
        if use_bar:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.total, desc=desc, unit=unit or "it", file=self.stream, leave=False)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        else:
            elapsed = time.perf_counter() - self.start
            stage(f"{self.desc}：{self.done}/{self.total} {self.unit}（已用 {elapsed:.0f} 秒）", self.stream)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
