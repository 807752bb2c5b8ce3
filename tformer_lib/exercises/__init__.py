"""练习检查器：``check_x(读者的函数)`` 打印 ⏳ 尚未完成 / ✅ 通过 / ❌ + 提示，并返回结果对象。

- 框架：:mod:`tformer_lib.exercises._core`（运行检查、随机情形）、:mod:`._compare`（比较读者的返回值）、
  :mod:`._mistakes`（错误与已知错误写法）、:mod:`._sandbox`（记下禁用库函数的调用、把读者的函数送进子进程）；
- 每章的检查器在自己的 ``chNN.py``（第 1–17 章）；:mod:`.checks` 是第 2、6 章共用的两个经典检查器。

第 1–8 章的笔记本从这里导入检查器（``from tformer_lib.exercises import check_x``），下面按章号依次列出；
第 9–17 章的笔记本从各章的模块导入（``from tformer_lib.exercises.ch09 import ...``）——不同章有同名的检查器
（如第 7、9 章的 ``check_initial_loss``），平铺到这里会互相覆盖。
"""

from tformer_lib.exercises._core import CheckResult, Mistake, Variant, compare, run_checks
from tformer_lib.exercises.checks import check_positional_encoding, check_softmax

# 第 1 章
from tformer_lib.exercises.ch01 import check_encode, check_mixed_cosine, check_pad_batch, check_unk_rate

# 第 2 章
from tformer_lib.exercises.ch02 import check_order_blindness_test, check_pe_distance, check_relative_position_index

# 第 3 章
from tformer_lib.exercises.ch03 import (
    check_fixed_attention,
    check_min_scale,
    check_self_weight,
    check_softmax_backward,
    check_unit_variance_scale,
)

# 第 4 章
from tformer_lib.exercises.ch04 import (
    check_changed_positions,
    check_fixed_masked_attention,
    check_fixed_mha_forward,
    check_layer_param_count,
    check_sliding_window_mask,
)

# 第 5 章
from tformer_lib.exercises.ch05 import (
    check_cached_greedy_decode,
    check_cross_attention_fix,
    check_cross_attention_shapes,
    check_decoder_mask,
    check_greedy_decode,
    check_shift_targets,
    check_transformer_params,
)

# 第 6 章
from tformer_lib.exercises.ch06 import (
    check_cross_entropy,
    check_greedy_agreement,
    check_log_softmax,
    check_softmax_temperature,
    check_temperature_grad,
    check_top_k_probs,
)

# 第 7 章
from tformer_lib.exercises.ch07 import (
    check_beam_score,
    check_half_peak_step,
    check_initial_loss,
    check_smoothed_loss,
    check_smoothed_targets,
)

# 第 8 章
from tformer_lib.exercises.ch08 import (
    check_decoder_crossover,
    check_flash_step,
    check_gqa_kv_bytes,
    check_tiled_peak_bytes,
)

# 第 15 章
# 第 15 章的检查器要 triton（kernels extra）：按需导入，没装 triton 时其余各章的检查器照常可用
_CH15 = ("check_attention_hbm_bytes", "check_combine_splits", "check_decoding_partial_bytes", "check_softmax_launch")


def __getattr__(name):
    if name in _CH15:
        from tformer_lib.exercises import ch15

        return getattr(ch15, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
