"""run_context_parallel（第 16 章笔记本用的运行器）：拼回的输出与梯度等于单进程的注意力，字节等于公式，坏参数清楚报错。"""

import pytest
import torch
import torch.nn.functional as F

from tformer_lib.parallel.context_parallel import run_context_parallel
from tformer_lib.parallel.ring_attention import ring_attention_payload, ring_attention_saved_bytes
from tformer_lib.parallel.ulysses import ulysses_payload

B, H, T, D = 1, 2, 8, 4


def _inputs():
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(B, H, T, D, generator=gen, dtype=torch.float64) for _ in range(4)]


@pytest.mark.distributed
@pytest.mark.parametrize("scheme, layout", [("ring", "zigzag"), ("ring", "contiguous"), ("ulysses", "contiguous")])
def test_gathered_results_equal_one_process(scheme, layout):
    q, k, v, d_out = _inputs()
    q.requires_grad_(True)  # 调用者的张量要不要梯度都行：送进去的只是数值
    got = run_context_parallel(q, k, v, d_out, scheme=scheme, layout=layout, world_size=2)
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(*leaves, is_causal=True)
    ref.backward(d_out)
    torch.testing.assert_close(got["out"], ref.detach(), rtol=0, atol=1e-12)
    for g, leaf in zip(got["grads"], leaves):
        torch.testing.assert_close(g, leaf.grad, rtol=0, atol=1e-12)
    formula = (ring_attention_payload if scheme == "ring" else
               lambda *a: ulysses_payload(*a[:4], a[5]))(B, H, T // 2, D, 2, 8)
    assert got["forward_bytes"] == [formula["forward"]] * 2
    assert got["backward_bytes"] == [formula["backward"]] * 2
    if scheme == "ring":
        assert got["saved_bytes"] == [ring_attention_saved_bytes(B, H, T // 2, D, 8)] * 2
    else:
        assert got["saved_bytes"] == [None, None]


def test_bad_arguments_are_refused_before_starting_processes():
    q, k, v, d_out = _inputs()
    with pytest.raises(ValueError, match="scheme"):
        run_context_parallel(q, k, v, d_out, scheme="tree")
    with pytest.raises(ValueError, match="layout 应是 'contiguous'"):
        run_context_parallel(q, k, v, d_out, scheme="ulysses", layout="zigzag")
    with pytest.raises(ValueError, match="形状应相同"):
        run_context_parallel(q, k[..., :4, :], v, d_out)
    with pytest.raises(ValueError, match="d_out"):
        run_context_parallel(q, k, v, d_out[0])
    with pytest.raises(ValueError, match="seq_len"):
        run_context_parallel(q, k, v, d_out, world_size=3)
    with pytest.raises(ValueError, match="dtype 应相同"):
        run_context_parallel(q, k.float(), v, d_out)
    with pytest.raises(ValueError, match="头"):
        run_context_parallel(q, k, v, d_out, scheme="ulysses", layout="contiguous", world_size=4)
    with pytest.raises(TypeError, match="causal"):
        run_context_parallel(q, k, v, d_out, causal=1)
