"""第 16 章检查器里共享测试（tests/test_checkers_shared.py + tests/checkers/ch16.py）管不到的细节。"""

import sys
from pathlib import Path

import pytest
import torch

from tformer_lib.exercises import ch16
from tformer_lib.exercises.ch16 import (
    buggy_merge_partials,
    check_capacity_keep,
    check_predict_dropped,
    check_ring_attention_bytes,
)

sys.path.insert(0, str(Path(__file__).parent))
from checkers.ch16 import (  # noqa: E402
    CASES,
    _dropped_library,
    _keep_library,
    _ring_library,
    ref_merge_partials,
    ref_predict_dropped,
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_case_has_a_library_answer_and_at_least_four_wrong_ones(case):
    # hard_coded 由共享测试要求；本章每题还要有一个直接调用库里答案的错误答案
    assert "library" in {w.name for w in case.wrong}
    assert len(case.wrong) >= 4


def test_dropped_count_as_a_float32_zero_dim_tensor_passes(capsys):
    # 共享测试的 returns="int" 换型里只有 float64 的 0 维浮点张量
    assert check_predict_dropped(lambda *a: torch.tensor(float(ref_predict_dropped(*a)))).passed, \
        capsys.readouterr().out


def test_the_ban_names_the_library_function(capsys):
    result = check_capacity_keep(_keep_library)
    out = capsys.readouterr().out
    assert result.mistake == "library_call" and "within_capacity" in out and "直接调用了库里的" in out
    result = check_ring_attention_bytes(_ring_library)
    assert "ring_attention_payload" in capsys.readouterr().out
    result = check_predict_dropped(_dropped_library)
    assert "expert_capacity" in capsys.readouterr().out


def test_buggy_merge_is_exact_for_small_scores_and_overflows_for_large_ones():
    out_a, out_b = torch.randn(3, 4), torch.randn(3, 4)
    a, b = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([1.5, 0.0, -3.0])
    bug_out, bug_lse = buggy_merge_partials(out_a, a, out_b, b)
    ref_out, ref_lse = ref_merge_partials(out_a, a, out_b, b)
    assert torch.allclose(bug_out, ref_out, atol=1e-6) and torch.allclose(bug_lse, ref_lse, atol=1e-6)
    a, b = torch.tensor([400.0, 95.0, 300.0]), torch.tensor([401.0, 90.0, -float("inf")])
    _, bug_lse = buggy_merge_partials(out_a, a, out_b, b)
    assert torch.isinf(bug_lse).any()  # float32 的 e^95 已经是 inf
    ref_out, ref_lse = ref_merge_partials(out_a, a, out_b, b)
    assert torch.isfinite(ref_out).all() and torch.isfinite(ref_lse).all()
    assert torch.allclose(ref_out[2], out_a[2])  # 块 b 是空的：结果就是块 a


def test_merging_block_by_block_around_the_ring_equals_one_softmax():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(5, 12, generator=g) * 3 + 200  # (n, T)
    scores[:, 4:8] = float("-inf")  # 中间一整块被屏蔽
    v = torch.randn(12, 3, generator=g)  # (T, d)
    out, lse = torch.zeros(5, 3), torch.full((5,), float("-inf"))
    for start in range(0, 12, 4):
        out_b, lse_b = ch16._partial(scores[:, start:start + 4], v[start:start + 4])
        out, lse = ref_merge_partials(out, lse, out_b, lse_b)
    assert torch.allclose(out, torch.softmax(scores, -1) @ v, atol=1e-5)
    assert torch.allclose(lse, torch.logsumexp(scores, -1), atol=1e-4)


def test_library_functions_still_work_after_the_checks(capsys):
    from tformer_lib.moe import within_capacity

    check_capacity_keep(_keep_library)
    check_predict_dropped(_dropped_library)
    capsys.readouterr()
    assert within_capacity(torch.tensor([[0], [0], [0]]), 2, 2).tolist() == [[True], [True], [False]]


def test_module_exports():
    for name in ch16.__all__:
        assert hasattr(ch16, name), name
