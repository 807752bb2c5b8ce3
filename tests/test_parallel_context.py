"""上下文并行（2 与 4 个进程，gloo）：环形注意力（按顺序与之字形切片、因果与否）和 DeepSpeed-Ulysses 的前向与
反向都等于整条序列一次注意力；发出的字节与为反向存下的字节等于公式；之字形切片让因果的工作量均等。

容差：float64 里最大差 ≤ 1e-12（实测 ~1e-16 量级：只有求和顺序不同）；另有一组 float32 ≤ 1e-5。
"""

import pytest
import torch
import torch.nn.functional as F

from tformer_lib import causal_mask, scaled_dot_product_attention
from tformer_lib.parallel import launch
from tformer_lib.parallel.all_to_all import all_to_all
from tformer_lib.parallel.comm import recording
from tformer_lib.parallel.ring_attention import (
    causal_pairs,
    gather_sequence,
    ring_attention,
    ring_attention_payload,
    ring_attention_saved_bytes,
    sequence_positions,
    split_sequence,
)
from tformer_lib.parallel.ulysses import ulysses_attention, ulysses_payload

B, H, T, D = 2, 4, 16, 8
CASES = [("ring", "contiguous", True), ("ring", "zigzag", True), ("ring", "zigzag", False),
         ("ring", "contiguous", False), ("ulysses", "contiguous", True), ("ulysses", "contiguous", False)]


def _inputs(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=gen, dtype=dtype) for _ in range(4)]  # q, k, v, dO


def _worker(rank, world, inputs64, inputs32):
    out = {}
    for scheme, layout, causal in CASES:
        for name, (q, k, v, d_out) in (("f64", inputs64), ("f32", inputs32)):
            pos = sequence_positions(T, world, layout)
            ql, kl, vl = (split_sequence(x, pos)[rank].clone().requires_grad_(True) for x in (q, k, v))
            with recording() as forward_log:
                if scheme == "ring":
                    o = ring_attention(ql, kl, vl, layout=layout, causal=causal)
                else:
                    o = ulysses_attention(ql, kl, vl, causal=causal)
            saved = sum(t.numel() * t.element_size() for t in o.grad_fn.saved_tensors) if scheme == "ring" else None
            with recording() as backward_log:
                o.backward(split_sequence(d_out, pos)[rank])
            out[scheme, layout, causal, name] = {
                "out": o.detach(), "grads": [x.grad for x in (ql, kl, vl)], "saved": saved,
                "forward_bytes": sum(b for _, b in forward_log), "backward_bytes": sum(b for _, b in backward_log)}
    try:
        ulysses_attention(*(torch.zeros(1, world // 2, 2, 2) for _ in range(3)))
    except ValueError as e:
        out["heads_error"] = str(e)
    # 不连续的输入（split_heads 之后 transpose 出来的那种）与连续的结果相同
    q, k, v, _ = inputs32
    pos = sequence_positions(T, world, "zigzag")
    local = [split_sequence(x, pos)[rank] for x in (q, k, v)]
    strided = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in local]  # 同样的值，步长不同
    assert not strided[0].is_contiguous()
    out["strided_diff"] = float((ring_attention(*strided) - ring_attention(*local)).abs().max())
    # 各进程的本地长度不同：每个进程都得到清楚的错误（而不是 gloo 让进程崩溃）
    for name, fn in (("ring", ring_attention), ("ulysses", ulysses_attention)):
        x = torch.zeros(1, world, 2 + rank, 4)
        try:
            fn(x, x, x)
        except ValueError as e:
            out[f"{name}_length_error"] = str(e)
    # 行数不对的 all-to-all：负数，以及每个进程都说要收 2 行而对方只发 1 行
    for label, send, receive in (("negative", [2, -1] + [0] * (world - 2), [1] * world), ("mismatch", [1] * world, [2] * world)):
        try:
            all_to_all(torch.zeros(sum(send), 3), send, receive)
        except ValueError as e:
            out[f"a2a_{label}"] = str(e)
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def runs(request):
    world = request.param
    inputs64, inputs32 = _inputs(torch.float64), _inputs(torch.float32)
    return world, inputs64, inputs32, launch(_worker, world, (inputs64, inputs32), timeout=150)


def _reference(q, k, v, d_out, causal):
    q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
    o, _ = scaled_dot_product_attention(q, k, v, causal_mask(T) if causal else None)
    o.backward(d_out)
    return o.detach(), [x.grad for x in (q, k, v)]


@pytest.mark.distributed
@pytest.mark.parametrize("scheme,layout,causal", CASES)
def test_forward_and_backward_equal_whole_sequence_attention(runs, scheme, layout, causal):
    world, inputs64, inputs32, outs = runs
    for name, inputs, tol in (("f64", inputs64, 1e-12), ("f32", inputs32, 1e-5)):
        ref_out, ref_grads = _reference(*inputs, causal)
        pos = sequence_positions(T, world, layout)
        got = [outs[r][scheme, layout, causal, name] for r in range(world)]
        torch.testing.assert_close(gather_sequence([g["out"] for g in got], pos), ref_out, rtol=0, atol=tol)
        for i in range(3):
            torch.testing.assert_close(gather_sequence([g["grads"][i] for g in got], pos), ref_grads[i], rtol=0, atol=tol)


def test_reference_matches_pytorch_sdpa():
    q, k, v, _ = _inputs(torch.float64)
    ours, _ = _reference(q, k, v, torch.zeros_like(q), True)
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.distributed
def test_bytes_sent_and_saved_equal_the_formulas(runs):
    world, _, _, outs = runs
    n = T // world
    for rank in range(world):
        for (scheme, layout, causal, name), got in ((k, v) for k, v in outs[rank].items() if isinstance(k, tuple)):
            element = 8 if name == "f64" else 4
            if scheme == "ring":
                expected = ring_attention_payload(B, H, n, D, world, element)
                assert got["saved"] == ring_attention_saved_bytes(B, H, n, D, element)
            else:
                expected = ulysses_payload(B, H, n, D, element)
            assert got["forward_bytes"] == expected["forward"], (scheme, layout, causal, name)
            assert got["backward_bytes"] == expected["backward"], (scheme, layout, causal, name)
    # 环形注意力为反向存下的没有 T² 项：整条序列的显式注意力光概率就要 B·h·T² 个数
    assert ring_attention_saved_bytes(B, H, 1024 // world, D) < B * H * 1024 ** 2 * 4


@pytest.mark.distributed
def test_ulysses_names_heads_that_do_not_divide(runs):
    world, _, _, outs = runs
    assert f"头数 h={world // 2} 不能被进程数 p={world} 整除" in outs[0]["heads_error"]


def test_zigzag_balances_causal_work_and_contiguous_does_not():
    for world in (2, 4, 8):
        zig = causal_pairs(64, world, "zigzag")
        seq = causal_pairs(64, world, "contiguous")
        assert len(set(zig)) == 1
        assert seq == sorted(seq) and seq[-1] > seq[0]
        assert sum(zig) == sum(seq) == 64 * 65 // 2
    positions = sequence_positions(8, 2, "zigzag")
    assert [p.tolist() for p in positions] == [[0, 1, 6, 7], [2, 3, 4, 5]]


def test_split_and_gather_are_inverse_and_bad_input_is_named():
    x = torch.randn(2, 3, 12, 4)
    for layout in ("contiguous", "zigzag"):
        pos = sequence_positions(12, 3 if layout == "contiguous" else 2, layout)
        assert torch.equal(gather_sequence(split_sequence(x, pos), pos), x)
    with pytest.raises(ValueError, match="layout='zigzag' 要求 seq_len 能被 8 整除"):
        sequence_positions(12, 4, "zigzag")
    with pytest.raises(ValueError, match="layout"):
        sequence_positions(12, 2, "ring")
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="进程组"):
        ring_attention(q, q, q)
    with pytest.raises(ValueError, match="形状应相同"):
        ring_attention(q, q, torch.zeros(1, 2, 5, 8))
    with pytest.raises(ValueError, match="k 应是 4 维浮点张量"):
        ulysses_attention(q, torch.zeros(2, 4, 8), q)


@pytest.mark.distributed
def test_strided_inputs_unequal_lengths_and_bad_row_counts(runs):
    world, _, _, outs = runs
    for rank in range(world):
        out = outs[rank]
        assert out["strided_diff"] == 0.0
        expected = str([2 + r for r in range(world)])
        assert f"各进程的本地序列长度 T/p 应相同，收到 {expected}" in out["ring_length_error"]
        assert f"各进程的本地序列长度 T/p 应相同，收到 {expected}" in out["ulysses_length_error"]
        assert "send 应是" in out["a2a_negative"]
        assert f"receive={[2] * world} 与各进程实际要发来的行数 {[1] * world} 不符" in out["a2a_mismatch"]


def test_payload_at_one_rank_sends_nothing():
    assert ring_attention_payload(2, 4, 16, 8, 1) == {"forward": 0, "backward": 0}
