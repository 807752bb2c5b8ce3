import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tformer_lib import (
    MultiHeadAttention,
    causal_mask,
    fast_scaled_dot_product_attention,
    padding_mask,
    scaled_dot_product_attention,
)


def _qkv(b=2, h=3, t_q=5, t_k=6, d=8):
    return torch.randn(b, h, t_q, d), torch.randn(b, h, t_k, d), torch.randn(b, h, t_k, d)


def test_weights_rows_sum_to_one_and_masked_entries_are_zero():
    q, k, v = _qkv()
    mask = torch.rand(2, 1, 5, 6) > 0.3
    mask[..., 0] = True  # 每行至少留一个键
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == (2, 3, 5, 8) and w.shape == (2, 3, 5, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5))
    assert torch.all(w.masked_select(~mask.expand_as(w)) == 0)


def test_explicit_path_is_the_formula():
    q, k, v = _qkv()
    out, w = scaled_dot_product_attention(q, k, v)
    expected_w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(out, expected_w @ v)


def test_fully_masked_row_gives_zeros_not_nan_on_both_paths():
    q, k, v = _qkv(b=1, h=1, t_q=3, t_k=4)
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert torch.all(w[..., 1, :] == 0) and torch.all(out[..., 1, :] == 0)
    fast = fast_scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(fast).all()
    torch.testing.assert_close(fast, out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["none", "padding", "causal"])
def test_explicit_and_fast_paths_agree(kind):
    q, k, v = _qkv(t_q=6, t_k=6)
    tokens = torch.tensor([[4, 5, 6, 7, 0, 0], [4, 5, 6, 7, 8, 9]])
    mask = {"none": None, "padding": padding_mask(tokens, 0), "causal": causal_mask(6)}[kind]
    explicit, _ = scaled_dot_product_attention(q, k, v, mask)
    fast = fast_scaled_dot_product_attention(q, k, v, mask)
    assert (explicit - fast).abs().max().item() <= 1e-5
    # 与 PyTorch 自己的布尔掩码约定（True = 参与）也一致
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), explicit, atol=1e-5, rtol=1e-5)


def _copy_into_torch_mha(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    d = ours.d_model
    theirs = nn.MultiheadAttention(d, ours.n_heads, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
        theirs.out_proj.weight.copy_(ours.w_o.weight)
        theirs.out_proj.bias.copy_(ours.w_o.bias)
    return theirs.eval()


@pytest.mark.parametrize("fast", [False, True])
def test_multi_head_attention_equals_torch_with_padding_and_causal_masks(fast):
    ours = MultiHeadAttention(16, 4, fast=fast).eval()
    theirs = _copy_into_torch_mha(ours)
    x = torch.randn(2, 5, 16)
    tokens = torch.tensor([[3, 4, 5, 0, 0], [3, 4, 5, 6, 7]])
    keep = padding_mask(tokens, 0)  # (B, 1, 1, T)，True = 可关注
    # PyTorch 的 key_padding_mask 与 attn_mask（布尔）都是 True = 屏蔽：极性与我们相反
    expected, torch_w = theirs(x, x, x, key_padding_mask=tokens == 0, average_attn_weights=False)
    torch.testing.assert_close(ours(x, x, x, keep), expected, atol=1e-5, rtol=1e-5)
    if not fast:
        torch.testing.assert_close(ours.attn_weights, torch_w, atol=1e-5, rtol=1e-5)
    expected, _ = theirs(x, x, x, attn_mask=~causal_mask(5))
    torch.testing.assert_close(ours(x, x, x, causal_mask(5)), expected, atol=1e-5, rtol=1e-5)
    # 交叉注意力：查询与键值长度不同
    memory = torch.randn(2, 7, 16)
    expected, _ = theirs(x, memory, memory)
    torch.testing.assert_close(ours(x, memory, memory), expected, atol=1e-5, rtol=1e-5)


def test_multi_head_attention_keeps_last_weights_and_split_heads_order():
    mha = MultiHeadAttention(12, 3)
    x = torch.randn(2, 4, 12)
    mha(x, x, x)
    assert mha.attn_weights.shape == (2, 3, 4, 4)
    heads = mha.split_heads(x)
    assert heads.shape == (2, 3, 4, 4)
    torch.testing.assert_close(heads[:, 1, 2], x[:, 2, 4:8])  # 第 1 个头是第 4..7 维
    torch.testing.assert_close(mha.merge_heads(heads), x)


def test_attention_bad_inputs():
    with pytest.raises(ValueError, match="d_model=510 不能被 n_heads=8 整除"):
        MultiHeadAttention(510, 8)
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"query 应是 3 维张量 \(B, T, d_model\)，收到形状 \(5, 16\)"):
        mha(x[0], x[0], x[0])
    with pytest.raises(ValueError, match="query、key、value 的最后一维 d_model 应相同"):
        mha(x, torch.randn(2, 5, 8), torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="query 的最后一维是 8，但这一层的 d_model=16"):
        mha(torch.randn(2, 5, 8), x, x)
    with pytest.raises(ValueError, match="query 是空序列"):
        mha(torch.randn(2, 0, 16), x, x)
    with pytest.raises(ValueError, match=r"mask 的形状 \(3, 5\) 无法广播到分数的形状 \(2, 4, 5, 5\)"):
        mha(x, x, x, torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask 的 dtype 应是 torch.bool"):
        mha(x, x, x, torch.ones(5, 5))
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="q 与 k 的最后一维 d_k 应相同"):
        scaled_dot_product_attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="k 与 v 的长度 T_k 应相同"):
        scaled_dot_product_attention(q, k, v[..., :3, :])


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_fast_path_runs_bf16_under_every_cpu_kernel_set(capability):
    # torch 2.13 在有 AMX 的 Intel CPU 上、内核集低于 avx512 时，bf16 的 flash 内核报 pack_vnni2 错误；
    # 快速路径须退回数学后端。内核集只能在进程启动前选，所以在子进程里跑（别的 CPU 上同样必须通过）。
    import os
    import subprocess
    import sys

    script = (
        "import torch\n"
        "from tformer_lib.parts.attention import fast_scaled_dot_product_attention as fast, scaled_dot_product_attention\n"
        "torch.manual_seed(0)\n"
        "q, k, v = torch.randn(3, 2, 4, 128, 16).unbind(0)  # 序列要够长，flash 内核才走打包路径\n"
        "mask = torch.ones(128, 128, dtype=torch.bool).tril()\n"
        "for m in (None, mask):\n"
        "    want, _ = scaled_dot_product_attention(q, k, v, mask=m)\n"
        "    got = fast(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask=m)\n"
        "    assert got.dtype == torch.bfloat16\n"
        "    torch.testing.assert_close(got.float(), want, atol=0.05, rtol=0.05)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
