"""第 17 章的图：微调的得与失——每个运行一个点，坏输入得到点名的错误。"""

import json

import pytest

from tformer_lib.finetune.measure import RESULTS_PATH
from tformer_lib.plotting.finetune import plot_finetune_tradeoff


def test_one_point_per_run_and_one_label_per_method():
    rows = json.loads(RESULTS_PATH.read_text(encoding="utf-8"))["rows"]
    fig = plot_finetune_tradeoff(rows)
    ax = fig.axes[0]
    points = sum(len(line.get_xdata()) for line in ax.get_lines())
    assert points == len(rows)
    assert len(ax.texts) == len({r["name"] for r in rows})
    xs = [x for line in ax.get_lines() for x in line.get_xdata()]
    assert sorted(xs) == sorted(r["target_test"] for r in rows)


def test_bad_rows_are_named():
    with pytest.raises(ValueError, match="rows"):
        plot_finetune_tradeoff([])
    with pytest.raises(ValueError, match="others_test"):
        plot_finetune_tradeoff([{"name": "base", "target_test": 1.0, "trainable": 0}])
