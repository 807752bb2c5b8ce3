"""Triton 内核（第 15 章）在 CPU 上用解释器运行：每个内核对照 PyTorch，尺寸故意不是块大小的倍数；
显存读写字节由内核自己的 tl.load/tl.store 数出，并等于闭式公式。

解释器很慢（每个程序实例都用 NumPy 逐步执行），所以形状很小、用例很少。
"""

import importlib
import math
import os
import re
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # 必须在导入 triton 之前：测试用的是 CPU 张量

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="没有安装 triton（它在 test 与 kernels 两个可选依赖里）")

from tformer_lib import causal_mask, scaled_dot_product_attention  # noqa: E402
from tformer_lib.parts.flash import tiled_attention  # noqa: E402
from tformer_lib.kernels import (  # noqa: E402
    attention_io_bytes,
    count_hbm_bytes,
    decoding_reference,
    flash_attention,
    flash_attention_io_bytes,
    flash_decoding,
    flash_decoding_io_bytes,
    kernel_error_table,
    matmul,
    matmul_io_bytes,
    naive_attention,
    naive_attention_io_bytes,
    softmax_io_bytes,
    softmax_rows,
    vector_add,
    vector_add_io_bytes,
)
from tformer_lib.kernels import _runtime  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _library_mask(batch, t_q, t_k, causal, key_lengths):
    """库的约定（True = 可以关注）下的同一个掩码：(B, 1, T_q, T_k)。"""
    keep = torch.ones(batch, 1, t_q, t_k, dtype=torch.bool)
    if causal:
        keep = keep & torch.ones(t_q, t_k, dtype=torch.bool).tril()
    if key_lengths is not None:
        keep = keep & (torch.arange(t_k) < key_lengths[:, None])[:, None, None, :]
    return keep


# ---------------------------------------------------------------- 1–3：加法、softmax、矩阵乘


def test_vector_add_is_exact_on_ragged_lengths_and_reads_each_element_once():
    for n, block in ((1, 16), (1000, 128)):
        x, y = torch.randn(n), torch.randn(n)
        with count_hbm_bytes() as traffic:
            out = vector_add(x, y, block=block)
        assert torch.equal(out, x + y)
        assert (traffic.read, traffic.write) == (vector_add_io_bytes(n)["read"], vector_add_io_bytes(n)["write"])
    assert vector_add(torch.ones(2, 3), torch.ones(2, 3)).shape == (2, 3)


def test_softmax_rows_matches_torch_and_survives_large_scores():
    x = torch.randn(2, 5, 19) * 30  # 不减最大值，e^{数百} 会溢出成 inf/NaN
    with count_hbm_bytes() as traffic:
        out = softmax_rows(x, scale=4.0)
    assert torch.isfinite(out).all()
    assert (out - torch.softmax(4.0 * x, dim=-1)).abs().max() < 1e-6
    assert traffic.read == traffic.write == softmax_io_bytes(10, 19)["read"]
    causal = softmax_rows(x[0], causal=True)  # (5, 19)：第 i 行只看列 ≤ i
    reference = torch.softmax(x[0].masked_fill(~torch.ones(5, 19, dtype=torch.bool).tril(), float("-inf")), dim=-1)
    assert (causal - reference).abs().max() < 1e-6 and causal[0, 1:].eq(0).all()


def test_tiled_matmul_matches_torch_on_ragged_and_transposed_inputs():
    a, b = torch.randn(3, 37, 21), torch.randn(3, 50, 21).transpose(1, 2)  # b 是转置视图 (3, 21, 50)
    with count_hbm_bytes() as traffic:
        c = matmul(a, b, block_m=16, block_n=32, block_k=16)
    assert (c - a @ b).abs().max() < 1e-5
    expected = matmul_io_bytes(37, 21, 50, 16, 32, batch=3)
    assert (traffic.read, traffic.write) == (expected["read"], expected["write"])
    a2, b2 = torch.randn(17, 40), torch.randn(40, 9)
    assert (matmul(a2, b2, block_m=16, block_n=16, block_k=32) - a2 @ b2).abs().max() < 1e-5


# ---------------------------------------------------------------- 4：FlashAttention 前向


@pytest.mark.parametrize("causal, lengths, t_q, t_k, blocks", [
    (False, None, 37, 37, (16, 16)),
    (True, None, 37, 37, (16, 32)),
    (True, [37, 11], 37, 37, (32, 16)),
    (False, [45, 0], 19, 45, (16, 16)),  # 交叉注意力式的 T_q ≠ T_k；第二条序列没有有效键 → 输出 0
])
def test_flash_attention_equals_library_and_torch_sdpa_and_counts_its_bytes(causal, lengths, t_q, t_k, blocks):
    batch, heads, d = 2, 2, 20
    q, k, v = torch.randn(batch, heads, t_q, d), torch.randn(batch, heads, t_k, d), torch.randn(batch, heads, t_k, d)
    key_lengths = None if lengths is None else torch.tensor(lengths)
    with count_hbm_bytes() as traffic:
        out = flash_attention(q, k, v, causal=causal, key_lengths=key_lengths, block_m=blocks[0], block_n=blocks[1])
    mask = _library_mask(batch, t_q, t_k, causal, key_lengths)
    ours, _ = scaled_dot_product_attention(q, k, v, mask)
    assert (out - ours).abs().max() < 1e-6
    visible = mask.any(dim=-1)  # (B, 1, T_q)：有可见键的行；整行被屏蔽时 SDPA 的约定因版本而异
    torch_out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (out - torch_out).abs()[visible.expand(batch, heads, t_q)].max() < 1e-6
    if lengths is not None and 0 in lengths:
        assert out[lengths.index(0)].eq(0).all()
    expected = flash_attention_io_bytes(t_q, d, blocks[0], t_k=t_k, causal=causal, key_lengths=lengths,
                                        batch=batch, n_heads=heads)
    assert (traffic.read, traffic.write) == (expected["read"], expected["write"])


def test_flash_attention_is_chapter_8s_tiled_attention_and_its_bytes_depend_on_block_m_only():
    t, d = 40, 8
    q, k, v = (torch.randn(1, 1, t, d) for _ in range(3))
    counted = {}
    for block_m, block_n in ((16, 16), (16, 32), (32, 16)):
        with count_hbm_bytes() as traffic:
            out = flash_attention(q, k, v, causal=True, block_m=block_m, block_n=block_n)
        # 同一个算法：与第 8 章纯 PyTorch 的逐块注意力（键块同宽）一致
        assert (out - tiled_attention(q, k, v, causal_mask(t), block_size=block_n)).abs().max() < 1e-6
        counted[block_m, block_n] = traffic.total
        assert traffic.total == flash_attention_io_bytes(t, d, block_m, causal=True)["total"]
    assert counted[16, 16] == counted[16, 32] != counted[32, 16]
    n_q = math.ceil(t / 16)  # 因果的显式公式：K、V 各读 B_M·n_q(n_q-1)/2 + T 行
    assert counted[16, 16] == 4 * d * (t + 2 * (16 * n_q * (n_q - 1) // 2 + t)) + 4 * d * t


def test_naive_attention_is_correct_and_pays_for_s_and_p():
    batch, heads, t, d = 1, 2, 37, 20
    q, k, v = (torch.randn(batch, heads, t, d) for _ in range(3))
    with count_hbm_bytes() as naive:
        out = naive_attention(q, k, v, causal=True, block_m=16, block_n=32, block_k=16)
    assert (out - F.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().max() < 1e-6
    expected = naive_attention_io_bytes(t, d, 16, 32, batch=batch, n_heads=heads)
    assert (naive.read, naive.write) == (expected["read"], expected["write"])
    with count_hbm_bytes() as tiled:
        flash_attention(q, k, v, causal=False, block_m=16, block_n=32)
    both = attention_io_bytes(t, d, 16, 32, batch=batch, n_heads=heads)
    assert (naive.total, tiled.total) == (both["naive"]["total"], both["tiled"]["total"])
    assert tiled.total < naive.total and both["ratio"] == naive.total / tiled.total


def test_closed_forms_grow_as_the_io_argument_says():
    """朴素路径 ∝ T²（S、P 的来回），分块路径 ∝ T²·d/BLOCK_M：两者之比随 T 增大、随 BLOCK_M 增大。"""
    small, large = attention_io_bytes(1024, 64, 64, 64), attention_io_bytes(4096, 64, 64, 64)
    assert large["naive"]["total"] / small["naive"]["total"] == pytest.approx(16, rel=0.1)
    assert large["ratio"] > small["ratio"] > 1
    assert attention_io_bytes(4096, 64, 128, 64)["ratio"] > large["ratio"]
    sp = naive_attention_io_bytes(4096, 64, 64, 64)["scores_and_weights"]
    assert sp == 4 * 4096 * 4096 * 4  # 写 S、读 S、写 P、读 P（d ≤ BLOCK_N 时 P 只读一遍）


# ---------------------------------------------------------------- 5：FlashDecoding


def test_flash_decoding_equals_library_attention_over_the_cache_and_counts_its_bytes():
    batch, heads, t_max, d = 3, 2, 45, 20
    q, k, v = torch.randn(batch, heads, d), torch.randn(batch, heads, t_max, d), torch.randn(batch, heads, t_max, d)
    lengths = [45, 17, 0]
    cache_lengths = torch.tensor(lengths)
    with count_hbm_bytes() as traffic:
        out = flash_decoding(q, k, v, cache_lengths, split_size=16, block_n=8)  # 3 段，最后一段不满
    mask = _library_mask(batch, 1, t_max, False, cache_lengths)
    ours, _ = scaled_dot_product_attention(q[:, :, None], k, v, mask)  # (B, h, 1, d)
    assert (out - ours[:, :, 0]).abs().max() < 1e-6
    assert (out - decoding_reference(q, k, v, cache_lengths)).abs().max() < 1e-6
    torch_out = F.scaled_dot_product_attention(q[:2, :, None], k[:2], v[:2], attn_mask=mask[:2])[:, :, 0]
    assert (out[:2] - torch_out).abs().max() < 1e-6 and out[2].eq(0).all()
    expected = flash_decoding_io_bytes(lengths, t_max, d, 16, n_heads=heads)
    assert (traffic.read, traffic.write) == (expected["read"], expected["write"])
    one_split = flash_decoding(q, k, v, cache_lengths, split_size=64, block_n=16)  # 不切段：同一个结果
    assert (one_split - out).abs().max() < 1e-6


def test_kernel_error_table_covers_every_kernel_within_float32_rounding():
    rows = kernel_error_table()
    assert [r["kernel"] for r in rows] == ["vector_add", "softmax_rows", "matmul", "naive_attention",
                                           "flash_attention", "flash_attention", "flash_decoding"]
    assert all(0 <= r["max_abs_error"] < 1e-5 for r in rows)
    assert rows[0]["max_abs_error"] == 0  # 加法是逐元素的一次舍入，与 PyTorch 完全相同


def test_kernel_error_table_takes_a_device_and_draws_the_same_inputs_there():
    # 没有 GPU 时默认就是 CPU；显式给 device="cpu" 得到逐位相同的表（输入总在 CPU 上按种子生成再搬过去）
    assert kernel_error_table(seed=3, device="cpu") == kernel_error_table(seed=3)
    assert kernel_error_table(seed=3) != kernel_error_table(seed=4)
    bad_devices = [(True, TypeError), (1.5, TypeError), ("gpu", ValueError), ("meta", ValueError), ("cpu:5", ValueError)]
    if not torch.cuda.is_available():
        bad_devices.append(("cuda", ValueError))  # 没有 GPU 时要 cuda：说清楚，而不是 torch 的断言
    for bad, error in bad_devices:
        with pytest.raises(error, match="device"):
            kernel_error_table(device=bad)


def test_half_precision_inputs_accumulate_in_float32():
    q, k, v = (torch.randn(1, 1, 21, 8) for _ in range(3))
    out = flash_attention(q.half(), k.half(), v.half(), causal=True, block_m=16, block_n=16)
    reference = F.scaled_dot_product_attention(q.half().float(), k.half().float(), v.half().float(), is_causal=True)
    assert out.dtype == torch.float16 and (out.float() - reference).abs().max() < 2e-3
    lengths = torch.tensor([13])
    decoded = flash_decoding(q[:, :, 0].bfloat16(), k.bfloat16(), v.bfloat16(), lengths, split_size=16, block_n=8)
    expected = decoding_reference(q[:, :, 0].bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), lengths)
    assert decoded.dtype == torch.bfloat16 and (decoded.float() - expected).abs().max() < 1e-2
    with pytest.raises(TypeError, match="tl.dot 算不对 bfloat16"):
        flash_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())


# ---------------------------------------------------------------- 坏输入与环境


def test_bad_inputs_get_clear_errors():
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match="float64"):
        vector_add(x.double(), x.double())
    with pytest.raises(ValueError, match="形状应相同"):
        vector_add(x, x[:2])
    with pytest.raises(ValueError, match="block 应是 2 的幂"):
        vector_add(x, x, block=100)
    with pytest.raises(ValueError, match="block_k 至少为 16"):
        matmul(x, x.T, block_k=8)
    with pytest.raises(ValueError, match="最后一维（K）"):
        matmul(x, x)
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match=r"key_lengths 的值应在 \[0, 5\]"):
        flash_attention(q, q, q, key_lengths=torch.tensor([6]), block_m=16, block_n=16)
    with pytest.raises(TypeError, match="key_lengths 应是整数"):
        flash_attention(q, q, q, key_lengths=torch.tensor([2.0]))
    with pytest.raises(ValueError, match=r"\(B, h, T_q, d\)"):
        flash_attention(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="split_size 应是 block_n 的倍数"):
        flash_decoding(q[:, :, 0], q, q, torch.tensor([3]), split_size=16, block_n=32)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        _runtime.check_tensors(lambda: None, ("x", x))  # 编译版内核（不是解释器）拿到 CPU 张量


@pytest.mark.skipif(torch.cuda.is_available(), reason="有 GPU 时不替用户打开解释器")
def test_without_a_gpu_load_triton_turns_the_interpreter_on(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")  # 结束后 monkeypatch 恢复成 "1"
    _runtime.load_triton()
    assert os.environ["TRITON_INTERPRET"] == "1"


def test_missing_triton_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # 让 import triton 失败
    with pytest.raises(ImportError, match=r"tformer_lib\[kernels\]"):
        _runtime.load_triton()


def test_io_formulas_import_without_triton(monkeypatch):
    for name in [m for m in sys.modules if m.startswith("tformer_lib.kernels")]:
        monkeypatch.delitem(sys.modules, name)  # 重新导入本包（结束后 monkeypatch 放回原来的模块）
    monkeypatch.setitem(sys.modules, "triton", None)
    fresh = importlib.import_module("tformer_lib.kernels")
    assert fresh.attention_io_bytes(64, 16, 16, 16)["ratio"] > 1  # 公式不需要 triton
    with pytest.raises(ImportError, match=r"tformer_lib\[kernels\]"):
        fresh.flash_attention  # 内核需要：清楚地说装哪个可选依赖


def test_only_the_kernels_package_imports_triton():
    package = ROOT / "tformer_lib"
    offenders = [str(path.relative_to(package)) for path in package.rglob("*.py")
                 if "kernels" not in path.relative_to(package).parts[:1]
                 and re.search(r"^\s*(import triton|from triton)", path.read_text(encoding="utf-8"), re.M)]
    assert offenders == []
