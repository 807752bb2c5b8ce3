"""练习检查器：``check_x(读者的函数)`` 打印 ⏳ 尚未完成 / ✅ 通过 / ❌ + 提示，并返回结果对象。

框架在 :mod:`tformer_lib.exercises._core`；经典练习的检查器在 :mod:`tformer_lib.exercises.checks`；
各章自己的检查器在 ``chNN.py``，下面每章一个 ``# --- chNN ---`` 块（只追加，不改别人的行）。
"""

# --- core checkers (viz agent) ---
from tformer_lib.exercises._core import CheckResult, Mistake, Variant, compare, run_checks
from tformer_lib.exercises.checks import (
    check_attention,
    check_causal_mask,
    check_label_smoothing,
    check_lr_schedule,
    check_merge_heads,
    check_padding_mask,
    check_positional_encoding,
    check_softmax,
    check_split_heads,
)

# --- ch04 ---
from tformer_lib.exercises.ch04 import (
    check_changed_positions,
    check_fixed_masked_attention,
    check_fixed_mha_forward,
    check_layer_param_count,
    check_sliding_window_mask,
)

# --- ch01 ---
from tformer_lib.exercises.ch01 import check_encode, check_mixed_cosine, check_pad_batch, check_unk_rate

# --- ch03 ---
from tformer_lib.exercises.ch03 import (
    check_fixed_attention,
    check_min_scale,
    check_self_weight,
    check_softmax_backward,
    check_unit_variance_scale,
)

# --- ch02 ---
from tformer_lib.exercises.ch02 import check_order_blindness_test, check_pe_distance, check_relative_position_index

# --- ch05 ---
from tformer_lib.exercises.ch05 import (
    check_cached_greedy_decode,
    check_cross_attention_fix,
    check_cross_attention_shapes,
    check_decoder_mask,
    check_greedy_decode,
    check_shift_targets,
    check_transformer_params,
)

# --- ch08 ---
from tformer_lib.exercises.ch08 import (
    check_decoder_crossover,
    check_flash_step,
    check_gqa_kv_bytes,
    check_tiled_peak_bytes,
)

# --- ch06 ---
from tformer_lib.exercises.ch06 import (
    check_cross_entropy,
    check_greedy_agreement,
    check_log_softmax,
    check_softmax_temperature,
    check_temperature_grad,
    check_top_k_probs,
)

# --- ch07 ---
from tformer_lib.exercises.ch07 import (
    check_beam_score,
    check_half_peak_step,
    check_initial_loss,
    check_smoothed_loss,
    check_smoothed_targets,
)

# --- ch15 ---
# 第 15 章的检查器要 triton（kernels extra）：按需导入，没装 triton 时其余各章的检查器照常可用
_CH15 = ("check_attention_hbm_bytes", "check_combine_splits", "check_decoding_partial_bytes", "check_softmax_launch")


def __getattr__(name):
    if name in _CH15:
        from tformer_lib.exercises import ch15

        return getattr(ch15, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
