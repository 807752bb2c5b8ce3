"""第 8 章的图：能画出来、返回 Figure、坏参数给清楚的错误。"""

import pytest
import torch

from tformer_lib import TransformerConfig
from tformer_lib.plotting.efficiency import (
    plot_cost_scaling,
    plot_flops_breakdown,
    plot_flops_share,
    plot_kv_cache_schedule,
    plot_online_softmax,
    plot_ratio_bars,
    plot_tiled_attention,
)


def test_figures_draw():
    from matplotlib.figure import Figure

    c = TransformerConfig(10, 10, d_model=64, n_heads=4, d_ff=128)
    figs = [
        plot_cost_scaling([64, 128, 256], {"显式": [1.0, 4.0, 16.0]}, title="测试"),
        plot_flops_breakdown(c, [16, 64, 256, 1024]),
        plot_flops_share(64, 128, 4, 1024),
        plot_online_softmax(torch.tensor([1.0, 3.0, 0.0, 5.0, 2.0]), 2),
        plot_tiled_attention(torch.randn(3, 4), torch.randn(7, 4), 3, query_labels="人工智", key_labels="ABCDEFG"),
        plot_ratio_bars(["T=64", "T=128"], [0.9, 1.2], title="比值"),
        plot_kv_cache_schedule(4, tokens=["<bos>", "a", "b", "c"]),
    ]
    assert all(isinstance(f, Figure) for f in figs)


def test_bad_arguments():
    with pytest.raises(ValueError, match="series"):
        plot_cost_scaling([1, 2], {"a": [1.0]})
    with pytest.raises(ValueError, match="block_size"):
        plot_online_softmax(torch.ones(3), 0)
    with pytest.raises(ValueError, match="labels"):
        plot_ratio_bars(["a"], [1.0, 2.0])


def test_benchmark_figures_draw_from_a_results_dict(render):
    from tformer_lib.measurement.benchmarking import load_results
    from tformer_lib.plotting.benchmarks import plot_benchmark_results, plot_ratio_spread

    fig = render(plot_ratio_spread({"a": [0.9, 1.0, 1.1], "b": [0.5, 0.6]}, title="比值"))
    assert len(fig.axes[0].collections) == 2  # 每组一片散点
    results = load_results()  # 随包附带的结果
    live = results["train_step"]["small"]
    fig = render(plot_benchmark_results(results, live=live))
    assert len(fig.axes) == 2
    assert results["machine"]["date"] in fig._suptitle.get_text()
    with pytest.raises(ValueError, match="groups"):
        plot_ratio_spread({})
    with pytest.raises(ValueError, match="results"):
        plot_benchmark_results({})
