"""第 14 章的图：一步解码的时间分解（堆叠柱）——柱高是四份之和、下限画成水平线、中文画得出、坏输入给出清楚的错误。"""

import pytest

from tformer_lib.plotting.decode import plot_decode_breakdown

pytestmark = pytest.mark.filterwarnings("error")

PARTS = {"eager": {"overhead": 4e-3, "matmul": 1e-3, "attention": 5e-4, "other": 1.5e-3},
         "编译": {"overhead": 5e-4, "matmul": 8e-4, "attention": 1e-4, "other": 2e-4}}


def test_bars_stack_to_the_totals_and_floors_are_lines(render):
    ax = render(plot_decode_breakdown(PARTS, floors={"flop_floor_s": 5e-5, "byte_floor_s": 3e-4})).axes[0]
    tops = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    assert tops[0] == pytest.approx(7.0) and tops[1] == pytest.approx(1.6)  # 毫秒
    assert len(ax.patches) == 8 and ax.get_yscale() == "log"
    assert sorted(line.get_ydata()[0] for line in ax.get_lines()) == pytest.approx([0.05, 0.3])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["eager", "编译"]


def test_bad_breakdowns_are_named(render):
    with pytest.raises(ValueError, match="breakdowns"):
        plot_decode_breakdown({})
    with pytest.raises(ValueError, match="四项"):
        plot_decode_breakdown({"a": {"matmul": 1.0}})
    with pytest.raises(ValueError, match="overhead"):
        plot_decode_breakdown({"a": {"overhead": -1.0, "matmul": 1.0, "attention": 0.0, "other": 0.0}})


def test_breakdown_plot_refuses_bad_floors_infinite_times_and_a_non_axes():
    import pytest

    from tformer_lib.plotting.decode import plot_decode_breakdown

    parts = {"overhead": 1e-3, "matmul": 1e-3, "attention": 1e-4, "other": 1e-4}
    for floors in ({"flop_floor_s": 1e-4}, [1, 2], {"flop_floor_s": 0.0, "byte_floor_s": 1e-4}):
        with pytest.raises(ValueError, match="floors"):
            plot_decode_breakdown({"a": parts}, floors=floors)
    with pytest.raises(ValueError, match="有限的非负秒数"):
        plot_decode_breakdown({"a": {**parts, "matmul": float("inf")}})
    with pytest.raises(TypeError, match="ax"):
        plot_decode_breakdown({"a": parts}, ax="x")
    zero = dict.fromkeys(parts, 0.0)
    with pytest.raises(ValueError, match="大于 0"):
        plot_decode_breakdown({"a": zero}, floors={"flop_floor_s": 1e-4, "byte_floor_s": 1e-4})
