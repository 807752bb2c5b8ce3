"""第 17 章（微调）检查器的用例：参考答案（与 notebooks/solutions/17_solutions.ipynb 一致）和已知错误答案。"""

import math

import torch

from checkers import Case, Wrong
from tformer_lib.exercises.ch17 import (
    buggy_lora_branch,
    check_lora_branch,
    check_lora_parameter_count,
    check_lora_state_bytes,
    check_multi_lora_delta,
)
from tformer_lib.finetune import finetune_memory
from tformer_lib.finetune.multi_lora import MultiLoRALinear


# ---- 练习 1（推导并核对）：每个目标层 r·(in + out)，W^K、W^V 的 out 是 n_kv_heads·d_k ----
def _dims(d, h, kv, d_ff, gqa=True):
    k = kv * d // h if gqa else d
    return {"w_q": (d, d), "w_k": (k, d), "w_v": (k, d), "w_o": (d, d), "w_1": (d_ff, d), "w_2": (d, d_ff)}


def ref_lora_parameter_count(d_model, n_heads, n_kv_heads, d_ff, n_layers, rank, targets):
    dims = _dims(d_model, n_heads, n_kv_heads, d_ff)
    return n_layers * sum(rank * (dims[t][0] + dims[t][1]) for t in targets)


def _with(dims_fn, per_layer):
    return lambda d, h, kv, d_ff, n, r, t: per_layer(n, r, dims_fn(d, h, kv, d_ff), t)


def _loop(d, h, kv, d_ff, n, r, targets):  # 逐层逐矩阵加，也对
    total = 0
    for _ in range(n):
        for t in targets:
            out_f, in_f = _dims(d, h, kv, d_ff)[t]
            total += r * in_f + out_f * r
    return total


PARAMS = Case(check_lora_parameter_count, ref_lora_parameter_count, returns="int", also_correct=[_loop], wrong=[
    Wrong("hard_coded", lambda *a: 8388608),
    Wrong("full_matrix", _with(_dims, lambda n, r, dm, t: n * sum(r * dm[x][0] * dm[x][1] for x in t)), key="full_matrix"),
    Wrong("one_layer", _with(_dims, lambda n, r, dm, t: sum(r * (dm[x][0] + dm[x][1]) for x in t)), key="one_layer"),
    Wrong("no_gqa", lambda d, h, kv, d_ff, n, r, t: n * sum(r * sum(_dims(d, h, kv, d_ff, gqa=False)[x]) for x in t),
          key="no_gqa"),
    Wrong("only_a", _with(_dims, lambda n, r, dm, t: n * sum(r * dm[x][1] for x in t)), key="only_a"),
])


# ---- 练习 2（找错）：B = 0，A ~ U(±1/√in) ----
def ref_lora_branch(in_features, out_features, rank, generator=None):
    bound = 1 / math.sqrt(in_features)
    lora_A = (torch.rand(rank, in_features, generator=generator) * 2 - 1) * bound  # (r, in)：kaiming_uniform(a=√5)
    lora_B = torch.zeros(out_features, rank)  # (out, r)：B A = 0，起点就是原模型
    return lora_A, lora_B


def _kaiming(in_features, out_features, rank, generator=None):  # 直接用 nn.init，也对
    lora_A = torch.empty(rank, in_features)
    torch.nn.init.kaiming_uniform_(lora_A, a=math.sqrt(5), generator=generator)
    return lora_A, torch.zeros(out_features, rank)


BRANCH = Case(check_lora_branch, ref_lora_branch, also_correct=[_kaiming], wrong=[
    Wrong("hard_coded", lambda i, o, r, g=None: (torch.zeros(4, 16), torch.zeros(16, 4))),
    Wrong("the_bug", buggy_lora_branch, key="b_not_zero"),
    Wrong("both_zero", lambda i, o, r, g=None: (torch.zeros(r, i), torch.zeros(o, r)), key="both_zero"),
    Wrong("swapped", lambda i, o, r, g=None: (torch.zeros(r, i), torch.randn(o, r, generator=g)), key="swapped"),
    Wrong("randn_a", lambda i, o, r, g=None: (torch.randn(r, i, generator=g), torch.zeros(o, r)), key="a_scale"),
    Wrong("transposed", lambda i, o, r, g=None: tuple(t.T for t in ref_lora_branch(i, o, r, g)), key="shape"),
])


# ---- 练习 3（实现）：按 ids 挑出每个适配器的行，只给它们加 scaling·(x Aᵀ) Bᵀ ----
def ref_multi_lora_delta(x, ids, adapters):
    delta = torch.zeros(x.shape[0], adapters[0][1].shape[0])  # (N, out)
    for i, (lora_A, lora_B, scaling) in enumerate(adapters):
        rows = ids == i  # (N,)
        delta[rows] = scaling * (x[rows] @ lora_A.T @ lora_B.T)  # (n_i, in) → (n_i, r_i) → (n_i, out)
    return delta


def _per_row(x, ids, adapters):  # 逐行的写法，也对（慢）
    rows = [torch.zeros(adapters[0][1].shape[0]) if int(i) < 0 else
            adapters[int(i)][2] * (adapters[int(i)][1] @ (adapters[int(i)][0] @ x[n])) for n, i in enumerate(ids)]
    return torch.stack(rows)


def _negative(x, ids, adapters):
    return torch.stack([adapters[int(i)][2] * (adapters[int(i)][1] @ (adapters[int(i)][0] @ x[n])) for n, i in enumerate(ids)])


def _no_scaling(x, ids, adapters):
    return ref_multi_lora_delta(x, ids, [(a, b, 1.0) for a, b, _ in adapters])


def _library(x, ids, adapters):
    base = torch.nn.Linear(x.shape[1], adapters[0][1].shape[0], bias=False)
    torch.nn.init.zeros_(base.weight)
    layer = MultiLoRALinear(base, type("R", (), {"ids": ids})())
    for i, (a, b, s) in enumerate(adapters):
        layer.add(i, a, b, s)
    return layer(x).detach()


DELTA = Case(check_multi_lora_delta, ref_multi_lora_delta, also_correct=[_per_row], wrong=[
    Wrong("hard_coded", lambda x, ids, adapters: torch.zeros(4, 4)),
    Wrong("negative_index", _negative, key="negative_index"),
    Wrong("no_scaling", _no_scaling, key="no_scaling"),
    Wrong("library", _library, key="library_call"),
])


# ---- 练习 4（推导并核对）：底座只有权重；支路 4 + 4 + 8 字节 ----
def ref_lora_state_bytes(frozen_params, base_bytes, trainable_params):
    return frozen_params * base_bytes + trainable_params * (4 + 4 + 8)


STATE = Case(check_lora_state_bytes, ref_lora_state_bytes, returns="int", wrong=[
    Wrong("hard_coded", lambda f, b, t: 13611048960),
    Wrong("grads_for_frozen", lambda f, b, t: f * (b + 4) + 16 * t, key="grads_for_frozen"),
    Wrong("full_finetune", lambda f, b, t: 16 * (f + t), key="full_finetune"),
    Wrong("twelve", lambda f, b, t: f * b + 12 * t, key="twelve_per_trainable"),
    Wrong("bits", lambda f, b, t: 8 * (f * b + 16 * t), key="bits"),
    Wrong("library", lambda f, b, t: f * b + 16 * t if finetune_memory else 0, key="library_call"),
])

CASES = [PARAMS, BRANCH, DELTA, STATE]
