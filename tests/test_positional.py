import math

import pytest
import torch

from tformer_lib import (
    EncoderLayer,
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    sinusoidal_positional_encoding,
)


@pytest.mark.parametrize("d_model", [16, 64, 512, 7])
def test_pe_matches_formula_at_sampled_positions(d_model):
    max_len = 200
    pe = sinusoidal_positional_encoding(max_len, d_model)
    assert pe.shape == (max_len, d_model) and pe.dtype == torch.float32
    gen = torch.Generator().manual_seed(1)
    for pos, dim in zip(torch.randint(0, max_len, (50,), generator=gen), torch.randint(0, d_model, (50,), generator=gen)):
        pos, dim = int(pos), int(dim)
        i = dim // 2
        angle = pos / 10000 ** (2 * i / d_model)
        expected = math.sin(angle) if dim % 2 == 0 else math.cos(angle)
        assert pe[pos, dim].item() == pytest.approx(expected, abs=1e-6)


def test_pe_shift_is_a_fixed_rotation_per_frequency_pair():
    max_len, d_model, k = 100, 32, 5
    pe = sinusoidal_positional_encoding(max_len, d_model).double()
    omegas = 1 / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    # 对每个频率对 (sin, cos)：PE(pos+k) = R(k·ω) · PE(pos)，R 与 pos 无关
    rotation = torch.zeros(d_model, d_model, dtype=torch.float64)
    for j, w in enumerate(omegas):
        c, s = math.cos(k * w), math.sin(k * w)
        rotation[2 * j : 2 * j + 2, 2 * j : 2 * j + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    shifted = pe[:-k] @ rotation.T
    torch.testing.assert_close(shifted, pe[k:], atol=1e-6, rtol=0)
    # 旋转保持范数
    torch.testing.assert_close(pe[k:].norm(dim=1), pe[:-k].norm(dim=1), atol=1e-6, rtol=0)


def test_pe_rows_are_distinct():
    pe = sinusoidal_positional_encoding(512, 64)
    distances = torch.cdist(pe, pe) + torch.eye(512) * 1e9
    assert distances.min() > 1e-3


def test_pe_module_adds_encoding_and_checks_length():
    module = SinusoidalPositionalEncoding(d_model=8, max_len=10)
    x = torch.zeros(2, 4, 8)
    torch.testing.assert_close(module(x, start=3)[0], sinusoidal_positional_encoding(10, 8)[3:7])
    with pytest.raises(ValueError, match="max_len=10"):
        module(torch.zeros(1, 11, 8))
    learned = LearnedPositionalEmbedding(d_model=8, max_len=10)
    assert learned(x).shape == (2, 4, 8)
    with pytest.raises(ValueError, match="max_len=10"):
        learned(torch.zeros(1, 8, 8), start=3)


def test_encoder_layer_is_permutation_equivariant_without_pe_and_not_with_it():
    layer = EncoderLayer(d_model=16, n_heads=4, d_ff=32).eval()
    x = torch.randn(1, 6, 16)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    torch.testing.assert_close(layer(x[:, perm]), layer(x)[:, perm], atol=1e-5, rtol=1e-5)
    pe = SinusoidalPositionalEncoding(16, max_len=10)
    with_pe = layer(pe(x[:, perm]))
    assert not torch.allclose(with_pe, layer(pe(x))[:, perm], atol=1e-3)


def test_rope_scores_depend_only_on_relative_position():
    q, k = torch.randn(1, 1, 16), torch.randn(1, 1, 16)

    def score(m, n):
        qm = apply_rope(q, torch.tensor([m]))
        kn = apply_rope(k, torch.tensor([n]))
        return (qm * kn).sum().item()

    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)
    # 旋转不改变向量长度；位置 0 不变（half-split 约定）
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(apply_rope(x).norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(apply_rope(x)[:, 0], x[:, 0])
    with pytest.raises(ValueError, match="RoPE 要求 x 的最后一维是偶数"):
        apply_rope(torch.randn(2, 5, 7))


def test_alibi_bias_is_linear_in_distance_with_geometric_slopes():
    slopes = alibi_slopes(8)
    torch.testing.assert_close(slopes, torch.tensor([2.0 ** (-(k + 1)) for k in range(8)]))
    bias = alibi_bias(8, 5, 5)
    assert bias.shape == (8, 5, 5)
    assert torch.all(bias.diagonal(dim1=1, dim2=2) == 0)
    torch.testing.assert_close(bias[0, 4, 1], torch.tensor(-3 * 0.5))
    assert alibi_slopes(6).shape == (6,)
