"""第 2 章检查器的用例：参考答案（与 notebooks/solutions/02_solutions.ipynb 一致）和已知错误答案。"""

import math

import torch

from checkers import Case, Wrong
from tformer_lib import sinusoidal_positional_encoding
from tformer_lib.exercises import check_positional_encoding
from tformer_lib.parts.relative_position import relative_position_index
from tformer_lib.exercises.ch02 import check_order_blindness_test, check_pe_distance, check_relative_position_index


# ---- 练习 1：距离的闭式 ----
def ref_pe_distance(k, d_model):
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d/2,)
    return math.sqrt(float((2 - 2 * torch.cos(k * omega)).sum()))


def _measured_distance(k, d_model):  # 直接量：也是正确答案
    from tformer_lib import sinusoidal_positional_encoding

    pe = sinusoidal_positional_encoding(k + 1, d_model).double()
    return float((pe[k] - pe[0]).norm())


PE_DISTANCE = Case(check_pe_distance, ref_pe_distance, returns="number", also_correct=[_measured_distance], wrong=[
    Wrong("hard_coded", lambda k, d: 3.7143),
    Wrong("squared", lambda k, d: ref_pe_distance(k, d) ** 2, key="squared"),
    Wrong("missing_factor_2", lambda k, d: ref_pe_distance(k, d) / math.sqrt(2), key="missing_factor_2"),
    Wrong("sqrt_d", lambda k, d: math.sqrt(d), key="sqrt_d"),
    Wrong("sin_instead_of_cos", lambda k, d: math.sqrt(float((2 - 2 * torch.sin(
        k * 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d))).sum())), key="values"),
])


# ---- 练习 2：找错（exp–log 写法里 arange(d_model // 2) 给出的是 i，不是 2i）----
def ref_positional_encoding(max_len, d_model):
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    omega = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))  # (d/2,)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(pos * omega)
    pe[:, 1::2] = torch.cos(pos * omega)
    return pe


def buggy_positional_encoding(max_len, d_model):  # 本章给读者的有错版本
    pos = torch.arange(max_len).float()[:, None]  # (max_len, 1)
    omega = torch.exp(torch.arange(0, d_model // 2) * (-math.log(10000.0) / d_model))  # (d_model/2,)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(pos * omega)
    pe[:, 1::2] = torch.cos(pos * omega)
    return pe


def _swapped(max_len, d_model):
    pe = ref_positional_encoding(max_len, d_model)
    return torch.stack([pe[:, 1::2], pe[:, 0::2]], dim=-1).reshape(max_len, d_model)  # (max_len, d_model)


def _imports_inside(max_len, d_model):  # 在函数体里导入也一样是调用答案
    from tformer_lib.parts.positional import SinusoidalPositionalEncoding

    return SinusoidalPositionalEncoding(d_model, max_len).pe[:max_len]


PE_FIX = Case(check_positional_encoding, ref_positional_encoding, name="check_positional_encoding_find_the_bug",
              wrong=[
                  Wrong("hard_coded", lambda max_len, d: ref_positional_encoding(6, 8)),
                  Wrong("planted_bug_i_not_2i", buggy_positional_encoding, key="exponent_i"),
                  Wrong("sin_cos_swapped", _swapped, key="sin_cos_swapped"),
                  Wrong("pos_from_1", lambda m, d: ref_positional_encoding(m + 1, d)[1:], key="pos_from_1"),
                  Wrong("transposed", lambda m, d: ref_positional_encoding(m, d).T),
                  Wrong("calls_the_library", lambda m, d: sinusoidal_positional_encoding(m, d), key="library_call"),
                  Wrong("imports_inside", _imports_inside, key="library_call"),
              ])


# ---- 练习 3：相对位置下标 ----
def ref_relative_index(t_q, t_k, max_distance):
    rel = torch.arange(t_k)[None, :] - torch.arange(t_q)[:, None]  # (T_q, T_k)：j − i
    return rel.clamp(-max_distance, max_distance) + max_distance


def _rel(t_q, t_k):
    return torch.arange(t_k)[None, :] - torch.arange(t_q)[:, None]  # (T_q, T_k)


REL_INDEX = Case(check_relative_position_index, ref_relative_index,
                 also_correct=[lambda q, k, K: ref_relative_index(q, k, K).int(),
                               lambda q, k, K: ref_relative_index(q, k, K).numpy()],
                 wrong=[
                     Wrong("hard_coded", lambda q, k, K: ref_relative_index(5, 5, 2)),
                     Wrong("square_only", lambda q, k, K: ref_relative_index(q, q, K)),
                     Wrong("direction", lambda q, k, K: (-_rel(q, k)).clamp(-K, K) + K, key="direction"),
                     Wrong("no_offset", lambda q, k, K: _rel(q, k).clamp(-K, K), key="no_offset"),
                     Wrong("no_clip", lambda q, k, K: _rel(q, k) + K, key="no_clip"),
                     Wrong("absolute", lambda q, k, K: _rel(q, k).abs().clamp(max=K), key="absolute"),
                     Wrong("float", lambda q, k, K: ref_relative_index(q, k, K).float(), key="dtype"),
                     Wrong("library_call", lambda q, k, K: relative_position_index(q, k, K), key="library_call"),
                 ])


# ---- 练习 4：顺序盲测试 ----
def ref_is_order_blind(layer, x):
    perm = torch.randperm(x.shape[1])
    while x.shape[1] > 1 and torch.equal(perm, torch.arange(x.shape[1])):
        perm = torch.randperm(x.shape[1])  # 确保真的打乱了
    with torch.no_grad():
        return torch.allclose(layer(x[:, perm]), layer(x)[:, perm], atol=1e-5)


def _forgot_to_permute_output(layer, x):
    perm = torch.arange(x.shape[1]).flip(0)
    with torch.no_grad():
        return torch.allclose(layer(x[:, perm]), layer(x), atol=1e-5)


def _permuted_batch_dim(layer, x):
    perm = torch.arange(x.shape[0]).flip(0)
    with torch.no_grad():
        return torch.allclose(layer(x[perm]), layer(x)[perm], atol=1e-5)


ORDER = Case(check_order_blindness_test, ref_is_order_blind, returns="bool", wrong=[
    Wrong("hard_coded", lambda layer, x: True),
    Wrong("always_false", lambda layer, x: False),
    Wrong("forgot_to_permute_output", _forgot_to_permute_output, key="forgot_to_permute_output"),
    Wrong("permuted_batch_dim", _permuted_batch_dim, key="wrong_dimension"),
])

CASES = [PE_DISTANCE, PE_FIX, REL_INDEX, ORDER]
