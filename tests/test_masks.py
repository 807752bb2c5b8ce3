import pytest
import torch

from tformer_lib import PAD, causal_mask, combine_masks, padding_mask, target_mask


def test_causal_mask_is_lower_triangular_bool():
    m = causal_mask(4)
    assert m.dtype == torch.bool and m.shape == (4, 4)
    assert torch.equal(m, torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool))


def test_padding_mask_marks_real_tokens_and_broadcasts():
    tokens = torch.tensor([[5, 6, PAD], [7, PAD, PAD]])
    m = padding_mask(tokens, PAD)
    assert m.shape == (2, 1, 1, 3)
    assert torch.equal(m[:, 0, 0], torch.tensor([[True, True, False], [True, False, False]]))


def test_combined_target_mask():
    tgt = torch.tensor([[5, 6, PAD]])
    m = target_mask(tgt, PAD)
    assert m.shape == (1, 1, 3, 3)
    expected = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    assert torch.equal(m[0, 0], expected)
    assert combine_masks(None, None) is None


def test_mask_bad_inputs():
    with pytest.raises(ValueError, match="n 应是正整数，收到 0"):
        causal_mask(0)
    with pytest.raises(ValueError, match=r"tokens 应是 2 维张量 \(B, T\)"):
        padding_mask(torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="masks 里的每个掩码都应是 torch.bool"):
        combine_masks(torch.ones(2, 2))
