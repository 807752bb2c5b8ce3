"""第 5 章检查器里共享测试（tests/test_checkers_shared.py + tests/checkers/ch05.py）管不到的细节。"""

import sys
from pathlib import Path

import pytest
import torch

from tformer_lib import DecoderLayer, TransformerConfig, count_parameters, make_model
from tformer_lib.exercises.ch05 import (
    check_cross_attention_fix,
    check_greedy_decode,
    transformer_params_formula,
)

sys.path.insert(0, str(Path(__file__).parent))
from checkers.ch05 import ref_fixed_layer, ref_greedy  # noqa: E402


def test_model_methods_restored_after_check():
    def sneaky(model, src, max_len):
        sneaky.model = model
        return ref_greedy(model, src, max_len)

    check_greedy_decode(sneaky, verbose=False)
    assert "encode" not in vars(sneaky.model) and "decode" not in vars(sneaky.model)


def test_layer_forward_restored_after_fix_check():
    seen = []

    def keep(layer, *args):
        seen.append(layer)
        return ref_fixed_layer(layer, *args)

    assert check_cross_attention_fix(keep, verbose=False).passed
    assert seen and all("forward" not in vars(layer) for layer in seen)
    assert all(isinstance(layer, DecoderLayer) for layer in seen)


@pytest.mark.parametrize("sizes", [(11, 13, 16, 40, 1), (30, 20, 24, 7, 3), (100, 90, 32, 128, 2)])
def test_params_formula_matches_a_built_model(sizes):
    vs, vt, d, d_ff, n = sizes
    model = make_model(TransformerConfig(vs, vt, d_model=d, n_heads=4, d_ff=d_ff, n_encoder_layers=n,
                                         n_decoder_layers=n))
    assert count_parameters(model) == transformer_params_formula(vs, vt, d, d_ff, n)


def test_checkers_do_not_touch_global_rng():
    torch.manual_seed(0)
    a = torch.rand(1)
    torch.manual_seed(0)
    check_greedy_decode(ref_greedy, verbose=False)
    check_cross_attention_fix(ref_fixed_layer, verbose=False)
    assert torch.equal(torch.rand(1), a)
