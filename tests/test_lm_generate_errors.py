"""生成的坏输入：eos_id 越界或被屏蔽、所有词都被屏蔽、缓存的层数或批大小不对。"""

import pytest
import torch

from tformer_lib.lm import LMCache, LMConfig, generate, make_lm, next_token_distribution


def _model():
    torch.manual_seed(0)
    return make_lm(LMConfig(vocab_size=40, d_model=16, n_heads=4, n_layers=2, d_ff=32, max_len=12)).eval()


@pytest.mark.parametrize("eos_id", [99, -1, True, 1])
def test_bad_eos_id(eos_id):
    with pytest.raises(ValueError, match="eos_id"):
        generate(_model(), [5, 6], 3, method="greedy", eos_id=eos_id)


def test_suppressing_every_id_is_an_error_not_silent_padding():
    with pytest.raises(ValueError, match="suppress_ids"):
        generate(_model(), [5, 6], 3, method="greedy", suppress_ids=range(40))
    with pytest.raises(ValueError, match="NaN"):
        next_token_distribution(torch.full((1, 40), float("nan")))


def test_cache_must_match_model_and_batch():
    model = _model()
    with pytest.raises(ValueError, match="cache"):
        model(torch.tensor([[5, 6]]), cache=LMCache(5))
    cache = model.new_cache()
    model(torch.tensor([[5, 6], [7, 8]]), cache=cache)
    with pytest.raises(ValueError, match="批大小"):
        model(torch.tensor([[5]]), cache=cache)
