"""_checks.positive_ints：非空的正整数序列（列表、元组、NumPy 数组里的整数），坏输入给出点名参数的错误。"""

import numpy as np
import pytest

from tformer_lib._checks import positive_ints


def test_accepts_lists_tuples_ranges_and_numpy_integers():
    assert positive_ints("sizes", [1, 2, 3]) == [1, 2, 3]
    assert positive_ints("sizes", (4,)) == [4] and positive_ints("sizes", range(1, 3)) == [1, 2]
    got = positive_ints("sizes", np.array([2, 5], dtype=np.int32))
    assert got == [2, 5] and all(type(v) is int for v in got)


@pytest.mark.parametrize("values", [[], [0], [-1], [1, 2.0], [True], [np.bool_(True)], [1, float("nan")]])
def test_refuses_empty_non_positive_and_non_integer_values(values):
    with pytest.raises(ValueError, match="sizes 应是非空的正整数序列"):
        positive_ints("sizes", values)


@pytest.mark.parametrize("values", ["12", b"\x01\x02", {1, 2}, {1: 2}, 5, None])
def test_refuses_unordered_or_non_sequences_with_a_type_error(values):
    with pytest.raises(TypeError, match="sizes 应是非空的正整数序列"):
        positive_ints("sizes", values)
