"""第 14 章量化的图：画出的数就是输入的数、中文画得出、坏输入给出清楚的错误。"""

import pytest

from tformer_lib.plotting.quant import gemv_roofline_points, plot_gemv_roofline, plot_quantization

pytestmark = pytest.mark.filterwarnings("error")

ROWS = [
    {"name": "fp32", "weight_bytes": 4 * 2**20, "kv_bytes_per_token": 4096, "perplexity": 82.0,
     "form_accuracy": 0.94, "form_accuracy_stderr": 0.017},
    {"name": "int4-g32", "weight_bytes": 2**20, "kv_bytes_per_token": 4096, "perplexity": 85.0,
     "form_accuracy": 0.90, "form_accuracy_stderr": 0.021},
    {"name": "int8-kv", "weight_bytes": 4 * 2**20, "kv_bytes_per_token": 1152, "perplexity": 82.1,
     "form_accuracy": 0.93, "form_accuracy_stderr": 0.018},
]

GEMV = {"n": 64, "peak_flops": 1e11, "bandwidth": 1e10, "variants": {
    "fp32": {"intensity_flop_per_byte": 0.5, "achieved_flops": 4e9},
    "int8 fused": {"intensity_flop_per_byte": 2.0, "achieved_flops": 1.5e10},
}}


def test_quantization_bars_are_the_rows(render):
    fig = render(plot_quantization(ROWS))
    ax_w, ax_kv, ax_ppl, ax_form = fig.axes
    assert [p.get_width() for p in ax_w.patches] == pytest.approx([4, 1, 4])
    assert [p.get_width() for p in ax_kv.patches] == [4096, 4096, 1152]
    assert list(ax_ppl.get_lines()[0].get_xdata()) == [82.0, 85.0, 82.1]
    assert [t.get_text() for t in ax_w.get_yticklabels()] == ["fp32", "int4-g32", "int8-kv"]
    dots = ax_form.get_lines()[0]
    assert list(dots.get_xdata()) == pytest.approx([0.94, 0.90, 0.93])
    with pytest.raises(ValueError, match="rows"):
        plot_quantization([])
    with pytest.raises(ValueError, match=r"rows\[0\].*perplexity"):
        plot_quantization([{"name": "x", "weight_bytes": 1, "kv_bytes_per_token": 1, "form_accuracy": 1,
                            "form_accuracy_stderr": 0}])


def test_gemv_roofline_points_and_figure(render):
    points, measured = gemv_roofline_points(GEMV)
    assert points == {"fp32": 0.5, "int8 fused": 2.0} and measured["int8 fused"] == 1.5e10
    ax = render(plot_gemv_roofline(GEMV)).axes[0]
    ys = [line.get_ydata()[0] for line in ax.get_lines()[1:] if len(line.get_ydata()) == 1]
    assert ys == pytest.approx([5e9, 4e9, 2e10, 1.5e10])  # 屋顶 = 强度 × 带宽，空心点 = 实测
    with pytest.raises(ValueError, match="variants"):
        gemv_roofline_points({"variants": {}})
