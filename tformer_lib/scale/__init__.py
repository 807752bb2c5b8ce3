"""真实规模的账本（第 9–13 章与第 16 章的补充）：把各章在随书小模型上核对过的公式，用到 GPT-2、LLaMA、Mistral、Qwen 上。

- :mod:`.accelerators`：A100 / H100 / H200 的显存、带宽与 bf16 算力（厂商数据手册）；
- :mod:`.ledger`：每章一个行函数（:func:`compute_row`、:func:`parameter_row`、:func:`memory_row`、
  :func:`parallel_rows`、:func:`serving_row`、第 16 章的 :func:`context_parallel_rows`），只调用各章自己的公式；
- :mod:`.table`：:func:`ledger_table` 一章一张表，:func:`format_table` 排成文本；
- :mod:`.scaling`：唐诗模型上的小缩放实验（几种大小 × 几种训练词元数）与幂律拟合（第 9 章；按需导入，
  ``python -m tformer_lib.scale.scaling`` 重新生成结果文件）。

层次：在 ``lm``、``measurement``、``parallel``、``serving`` 之上，画图与控件之下。
"""

from .accelerators import ACCELERATORS, GB
from .ledger import (
    CHINCHILLA_TOKENS_PER_PARAMETER,
    chinchilla_tokens,
    compute_row,
    context_parallel_rows,
    memory_row,
    parallel_rows,
    parameter_row,
    resolve_model,
    serving_row,
    training_compute_flops,
)
from .table import DEFAULT_MODELS, LEDGER_CHAPTERS, format_table, ledger_table
