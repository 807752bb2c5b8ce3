"""第 11 章检查器的用例：参考答案（与 notebooks/solutions/11_solutions.ipynb 一致）和已知错误答案。"""

import torch

from checkers import Case, Wrong
from tformer_lib.measurement.costs import saved_tensor_bytes
from tformer_lib.parts.feedforward import PositionwiseFeedForward
from tformer_lib.measurement.memory import model_state_bytes
from tformer_lib.measurement.precision import fp16_overflow
from tformer_lib.exercises.ch11 import (
    buggy_accumulated_loss,
    check_accumulated_loss,
    check_ffn_activation_bytes,
    check_fp16_overflow,
    check_model_state_bytes,
)


# ---- 练习 1（预测再验证）：参数 + 梯度（+ 主权重）+ 每个矩 4 字节；混合精度与 fp32 一样多 ----
def ref_state_bytes(n_params, precision, optimizer):
    weights = 4 + 4 if precision == "fp32" else 2 + 2 + 4  # 参数 + 梯度（混合精度：两份 16 位 + float32 主权重）
    return n_params * (weights + 4 * {"adamw": 2, "sgd_momentum": 1, "sgd": 0}[optimizer])


STATES = Case(check_model_state_bytes, ref_state_bytes, returns="int", wrong=[
    Wrong("hard_coded", lambda n, p, o: 16_000_000),
    Wrong("always_16", lambda n, p, o: 16 * n, key="adam_states"),  # 以前的题只有 AdamW：16n 总是对的
    Wrong("halved", lambda n, p, o: ref_state_bytes(n, "fp32", o) // (2 if p == "mixed" else 1), key="halved"),
    Wrong("no_master", lambda n, p, o: ref_state_bytes(n, p, o) - (4 * n if p == "mixed" else 0), key="no_master"),
    Wrong("no_optimizer_state", lambda n, p, o: 8 * n, key="no_optimizer_state"),  # 只有参数与梯度（与主权重）
    Wrong("elements", lambda n, p, o: n, key="elements"),
    # 库的 AdamW 账减去 SGD 少存的矩：数对了，但用的是库给的答案
    Wrong("library_call", lambda n, p, o: model_state_bytes(n, p)["total"] - 4 * n * (2 - {"adamw": 2, "sgd_momentum": 1,
                                                                                          "sgd": 0}[o]), key="library_call"),
])


# ---- 练习 2（推导并核对）：ReLU 1 份、GELU 2 份、SwiGLU 4 份 (B, T, d_ff) ----
def ref_ffn_activation_bytes(batch, length, d_ff, activation):
    return {"relu": 1, "gelu": 2, "swiglu": 4}[activation] * batch * length * d_ff * 4


def _measure_ffn(batch, length, d_ff, activation):  # 建一个 FFN 去量：数对，但绕过了推导
    ffn = PositionwiseFeedForward(4, d_ff, activation=activation)
    x = torch.randn(batch, length, 4, requires_grad=True)
    return saved_tensor_bytes(lambda: ffn(x), exclude=(*ffn.parameters(), x))


FFN = Case(check_ffn_activation_bytes, ref_ffn_activation_bytes, returns="int", wrong=[
    Wrong("hard_coded", lambda B, T, f, a: 4096),
    Wrong("one_copy", lambda B, T, f, a: B * T * f * 4, key="one_copy"),
    Wrong("elements", lambda B, T, f, a: ref_ffn_activation_bytes(B, T, f, a) // 4, key="elements"),
    Wrong("gelu_as_relu", lambda B, T, f, a: {"relu": 2, "gelu": 2, "swiglu": 4}[a] * B * T * f * 4, key="gelu_as_relu"),
    Wrong("measures_it", _measure_ffn, key="library_call"),
])


# ---- 练习 3（找错）：总和 / 整批目标数 ----
def ref_accumulated_loss(sums, counts):
    return sum(sums) / sum(counts)


ACCUM = Case(check_accumulated_loss, ref_accumulated_loss, returns="number",
             also_correct=[lambda s, c: (torch.tensor(s) / sum(c)).sum()], wrong=[
    Wrong("hard_coded", lambda s, c: 3.0),
    Wrong("the_bug", buggy_accumulated_loss, key="mean_of_means"),
    Wrong("sum_of_means", lambda s, c: sum(x / n for x, n in zip(s, c)), key="sum_of_means"),
    Wrong("sum_over_k", lambda s, c: sum(s) / len(s), key="sum_over_k"),
])


# ---- 练习 4（预测再验证）：value² · d_k > 65504 ----
def ref_fp16_overflows(value, d_k, scale_first):
    # 上溢看结果里最大的那个数：先乘后除是点积 value²·d_k，先除后乘是 value²·√d_k
    return value * value * (d_k ** 0.5 if scale_first else d_k) > 65504


def _computes_in_fp16(v, d, scale_first):  # 真的在 float16 里算一遍：结果对，但这是测量不是预测
    q = torch.full((d,), v).half()
    scale = torch.tensor(d ** -0.5).half()
    return not bool(torch.isfinite((q * scale) @ q if scale_first else (q @ q) * scale))


def _numpy_fp16(v, d, s):  # 在 NumPy 的 float16 里算：也是测量，不是预测
    import numpy as np

    q = np.full(d, v, dtype=np.float16)
    scale = np.float16(d ** -0.5)
    with np.errstate(over="ignore"):
        return not bool(np.isfinite((q * scale) @ q if s else (q @ q) * scale))


def _wrong_threshold(v, d, s):  # 规律对、边界错：离边界近的情形分得出来
    return v * v * (d ** 0.5 if s else d) > 1e5


FP16 = Case(check_fp16_overflow, ref_fp16_overflows, returns="bool",
            also_correct=[lambda v, d, s: v * v * (d ** 0.5 if s else d) > torch.finfo(torch.float16).max],  # 查表
            wrong=[
    Wrong("hard_coded", lambda v, d, s: True),
    Wrong("computes_in_fp16", _computes_in_fp16, key="computed"),
    Wrong("computes_in_numpy_fp16", _numpy_fp16, key="computed"),
    Wrong("ignores_the_order", lambda v, d, s: v * v * d > 65504, key="order_ignored"),
    Wrong("scaling_always_saves", lambda v, d, s: (not s) and v * v * d > 65504, key="scaled_still_overflows"),
    Wrong("scaled_either_way", lambda v, d, s: v * v * d ** 0.5 > 65504, key="scaled_either_way"),
    Wrong("bf16_range", lambda v, d, s: v * v * d > 3.4e38, key="missed_overflow"),
    Wrong("wrong_threshold", _wrong_threshold, key="values"),
    Wrong("wrong_exponent", lambda v, d, s: v * v * (d ** 0.45 if s else d) > 65504, key="values"),
    Wrong("fp16_tiny", lambda v, d, s: v * v * d > 6.1e-5, key="values"),
    Wrong("calls_the_library", lambda v, d, s: not fp16_overflow(v, d)["fp16"]["finite"], key="computed"),
])

CASES = [STATES, FFN, ACCUM, FP16]
