"""推理服务（第 13 章）：参差批次、连续批处理、分页 K/V 缓存、推测解码与一个本地 HTTP 服务。

每个部件都有测试证明：它生成的词元与逐条调用 ``generate(..., method="greedy")`` 完全相同。
层次（只向下依赖）：ragged → block_manager → paged_inputs → paged_cache → sampling → engine → workload → speculative → openai_api → server；测量在 measure，随包结果文件在 benchmark。
"""

from .ragged import check_prompts, greedy_batch, left_pad
from .block_manager import BlockManager, OutOfBlocksError
from .paged_cache import PagedKVCache
from .sampling import Sampling, pick_tokens
from .engine import Engine, Request
from .workload import WorkItem, make_workload, run_continuous, run_static, summarize
from .speculative import (
    SpeculativeStats,
    expected_speedup,
    expected_tokens_per_pass,
    layer_skip_draft,
    speculative_generate,
)
from .server import EngineWorker, create_app

__all__ = ["check_prompts", "greedy_batch", "left_pad", "BlockManager", "OutOfBlocksError", "PagedKVCache",
           "Sampling", "pick_tokens",
           "Engine", "Request", "WorkItem", "make_workload", "run_continuous", "run_static", "summarize",
           "SpeculativeStats", "expected_speedup", "expected_tokens_per_pass", "layer_skip_draft",
           "speculative_generate", "EngineWorker", "create_app"]
