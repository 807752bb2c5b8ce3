"""第 16 章混合专家的图：线、点的个数与画出的数就是输入、中文画得出、坏输入给出点名的错误。"""

import json

import matplotlib.text
import numpy as np
import pytest

from tformer_lib.experiments.moe import MOE_LABELS, RESULTS_PATH
from tformer_lib.plotting import missing_glyphs
from tformer_lib.plotting.experts import plot_capacity_drop, plot_expert_load, plot_moe_validation

# 任何警告（包括缺字 “Glyph missing”）都算失败。
pytestmark = pytest.mark.filterwarnings("error")


def _texts(fig) -> str:
    return "".join(t.get_text() for t in fig.findobj(matplotlib.text.Text))


def _curves(ax):
    """有图例名的线（去掉 axhline 之类不进图例的线）。"""
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


def _load_runs():
    rng = np.random.default_rng(0)
    shares = rng.dirichlet(np.ones(4), size=(3, 4))  # (记录, 层, 专家)，每层加起来是 1
    load = [{"step": 20 * (t + 1), "shares": shares[t].tolist(), "drop_rate": 0.1} for t in range(3)]
    evals = [{"step": 0, "valid_loss": 8.4}, {"step": 100, "valid_loss": 5.9}]
    runs = [{"arm": "dense", "seed": 0, "evals": evals, "load": []},
            {"arm": "top1", "seed": 0, "evals": evals, "load": load}]
    return runs, shares


def test_expert_load_one_panel_per_layer_one_line_per_expert(render):
    runs, shares = _load_runs()
    fig = render(plot_expert_load(runs, arm="top1"))
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 4
    for layer, ax in enumerate(axes):
        lines = _curves(ax)
        assert [line.get_label() for line in lines] == [f"专家 {e}" for e in range(4)] + ["均分 1/4"]
        for e in range(4):
            assert list(lines[e].get_xdata()) == [20, 40, 60]
            assert list(lines[e].get_ydata()) == pytest.approx(shares[:, layer, e])
        assert list(lines[4].get_ydata()) == pytest.approx([0.25, 0.25])  # 均分线
        assert lines[4].get_linestyle() == "--"
        assert ax.get_title() == f"第 {layer + 1} 层"
    assert MOE_LABELS["top1"] in fig._suptitle.get_text()
    assert missing_glyphs(_texts(fig)) == []


def test_expert_load_real_results_top2(render):
    runs = json.loads(RESULTS_PATH.read_text(encoding="utf-8"))["runs"]
    fig = render(plot_expert_load(runs, arm="top2_fine", seed=1))
    run = next(r for r in runs if r["arm"] == "top2_fine" and r["seed"] == 1)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == len(run["load"][0]["shares"]) == 4
    last = run["load"][-1]["shares"]
    for layer, ax in enumerate(axes):
        lines = _curves(ax)
        assert len(lines) == 8 + 1  # 8 个专家 + 均分线
        assert [line.get_ydata()[-1] for line in lines[:8]] == pytest.approx(last[layer])
        assert lines[8].get_ydata()[0] == pytest.approx(1 / 8)


def test_expert_load_bad_input_is_named():
    runs, _ = _load_runs()
    with pytest.raises(ValueError, match="load"):
        plot_expert_load(runs, arm="dense")  # 稠密 FFN 没有专家
    with pytest.raises(ValueError, match="arm='top9'"):
        plot_expert_load(runs, arm="top9")
    with pytest.raises(ValueError, match="seed=3"):
        plot_expert_load(runs, arm="top1", seed=3)
    with pytest.raises(ValueError, match="runs"):
        plot_expert_load([], arm="top1")
    with pytest.raises(TypeError, match="runs"):
        plot_expert_load({"runs": runs}, arm="top1")
    with pytest.raises(ValueError, match=r"runs\[0\].*load"):
        plot_expert_load([{"arm": "top1", "seed": 0}], arm="top1")
    runs[1]["load"][1]["shares"] = [[0.5, 0.5]]
    with pytest.raises(ValueError, match=r"load\[1\]\['shares'\]"):
        plot_expert_load(runs, arm="top1")


CAPACITY = [{"arm": arm, "seed": seed, "capacity_factor": cf, "drop_rate": drop + 0.01 * seed,
             "valid_loss": loss + 0.1 * seed}
            for arm, scale in (("top1", 1.0), ("top2_fine", 0.8))
            for seed in (0, 1)
            for cf, drop, loss in ((0.5, 0.5 * scale, 5.8), (1.0, 0.07 * scale, 5.1), (2.0, 0.0, 5.0 * scale))]


def test_capacity_drop_means_and_seed_points(render):
    fig = render(plot_capacity_drop(CAPACITY))
    ax_drop, ax_loss = fig.axes
    for ax, key, scale in ((ax_drop, "drop_rate", 100), (ax_loss, "valid_loss", 1)):
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0.5", "1", "2"]
        assert list(ax.get_xticks()) == [0.5, 1.0, 2.0]
        means = _curves(ax)
        assert [line.get_label() for line in means] == [MOE_LABELS["top1"], MOE_LABELS["top2_fine"]]
        points = [line for line in ax.get_lines() if line.get_label().startswith("_")]
        assert len(points) == 2
        for arm, mean, dots in zip(("top1", "top2_fine"), means, points):
            rows = [r for r in CAPACITY if r["arm"] == arm]
            for cf, y in zip(mean.get_xdata(), mean.get_ydata()):
                assert y == pytest.approx(scale * np.mean([r[key] for r in rows if r["capacity_factor"] == cf]))
            assert len(dots.get_xdata()) == len(rows) == 6  # 每个种子、每个因子一个点
            assert sorted(dots.get_ydata()) == pytest.approx(sorted(scale * r[key] for r in rows))
            assert mean.get_color() == dots.get_color()
    assert "%" in ax_drop.get_ylabel() and "容量因子" in ax_drop.get_xlabel()
    assert missing_glyphs(_texts(fig)) == []


def test_capacity_drop_bad_rows_are_named():
    with pytest.raises(ValueError, match="capacity_rows"):
        plot_capacity_drop([])
    with pytest.raises(ValueError, match=r"capacity_rows\[0\].*drop_rate"):
        plot_capacity_drop([{"arm": "top1", "seed": 0, "capacity_factor": 1.0, "valid_loss": 5.0}])
    with pytest.raises(TypeError, match=r"capacity_rows\[1\]"):
        plot_capacity_drop([CAPACITY[0], 3])


def test_moe_validation_one_line_per_arm_and_seed(render):
    runs = json.loads(RESULTS_PATH.read_text(encoding="utf-8"))["runs"]
    fig = render(plot_moe_validation(runs))
    ax = fig.axes[0]
    lines = _curves(ax)
    assert len(lines) == len(runs) == 6
    by_label = {line.get_label(): line for line in lines}
    for run in runs:
        line = by_label[f"{MOE_LABELS[run['arm']]} · 种子 {run['seed']}"]
        assert list(line.get_xdata()) == [e["step"] for e in run["evals"]]
        assert list(line.get_ydata()) == pytest.approx([e["valid_loss"] for e in run["evals"]])
    for arm in MOE_LABELS:
        mine = [line for line, run in zip(lines, runs) if run["arm"] == arm]
        assert len({line.get_color() for line in mine}) == 1  # 同一组一种颜色
        assert len({line.get_linestyle() for line in mine}) == len(mine)  # 每个种子一种线型
    assert len({line.get_color() for line in lines}) == 3
    later = [e["valid_loss"] for r in runs for e in r["evals"] if e["step"] > 0]
    lo, hi = ax.get_ylim()
    assert lo <= min(later) and hi >= max(later) and hi < 8.0  # 第 0 步（≈ 8.4）在图框上方
    assert {t.get_text() for t in ax.get_legend().get_texts()} == set(by_label)
    assert missing_glyphs(_texts(fig)) == []


def test_moe_validation_labels_and_bad_input(render):
    runs, _ = _load_runs()
    fig = render(plot_moe_validation(runs, labels={"top1": "四专家"}, title="验证"))
    labels = [line.get_label() for line in _curves(fig.axes[0])]
    assert labels == [f"{MOE_LABELS['dense']} · 种子 0", "四专家 · 种子 0"]
    assert fig.axes[0].get_title() == "验证"
    with pytest.raises(TypeError, match="labels"):
        plot_moe_validation(runs, labels=["四专家"])
    with pytest.raises(ValueError, match=r"runs\[0\]\['evals'\]"):
        plot_moe_validation([{"arm": "top1", "seed": 0, "evals": []}])
    with pytest.raises(ValueError, match=r"runs\[0\].*evals"):
        plot_moe_validation([{"arm": "top1", "seed": 0}])


def test_expert_load_one_layer_and_shared_y(render):
    """一层的 MoE 也画得出（以前 new_figure 只返回一个 Axes 而崩溃）；多层时各面板真的共用纵轴。"""
    runs, shares = _load_runs()
    one = [{**runs[1], "load": [{**rec, "shares": rec["shares"][:1]} for rec in runs[1]["load"]]}]
    fig = render(plot_expert_load(one, arm="top1"))
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 1 and axes[0].get_title() == "第 1 层"
    assert [line.get_ydata()[-1] for line in _curves(axes[0])[:4]] == pytest.approx(shares[-1, 0])
    fig = render(plot_expert_load(runs, arm="top1"))
    first, *others = [ax for ax in fig.axes if ax.get_visible()]
    others[-1].set_ylim(0, 0.9)  # 改一个面板的纵轴，其余的跟着变
    assert first.get_ylim() == pytest.approx((0, 0.9))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_numbers_are_named(bad):
    runs, _ = _load_runs()
    runs[1]["load"][2]["shares"][1][3] = bad
    with pytest.raises(ValueError, match=r"load\[2\]\['shares'\].*有限.*下标 \(1, 3\)"):
        plot_expert_load(runs, arm="top1")
    runs, _ = _load_runs()
    runs[1]["load"][0]["step"] = bad
    with pytest.raises(ValueError, match=r"load\[0\]\['step'\]"):
        plot_expert_load(runs, arm="top1")
    rows = [dict(r) for r in CAPACITY]
    rows[4]["drop_rate"] = bad
    with pytest.raises(ValueError, match=r"capacity_rows\[4\]\['drop_rate'\]"):
        plot_capacity_drop(rows)
    runs, _ = _load_runs()
    runs[1]["evals"] = [{"step": 0, "valid_loss": 8.4}, {"step": 100, "valid_loss": bad}]
    with pytest.raises(ValueError, match=r"runs\[1\]\['evals'\]\[1\]\['valid_loss'\]"):
        plot_moe_validation(runs)


def test_non_numbers_are_named():
    rows = [dict(r) for r in CAPACITY]
    rows[0]["capacity_factor"] = "1.25"
    with pytest.raises(ValueError, match=r"capacity_rows\[0\]\['capacity_factor'\]"):
        plot_capacity_drop(rows)
    runs, _ = _load_runs()
    runs[0]["evals"] = [{"step": [0, 1], "valid_loss": 8.4}]
    with pytest.raises(ValueError, match=r"runs\[0\]\['evals'\]\[0\]\['step'\]"):
        plot_moe_validation(runs)


def test_shares_and_drop_rates_must_be_what_the_docstrings_say():
    runs, _ = _load_runs()
    runs[1]["load"][0]["shares"][2] = [-5.0, 7.0, 0.0, -1.0]  # 加起来是 1，却有负的份额
    with pytest.raises(ValueError, match=r"load\[0\]\['shares'\].*非负"):
        plot_expert_load(runs, arm="top1")
    runs, _ = _load_runs()
    runs[1]["load"][1]["shares"] = [["0.5", "0.5", "0", "0"]] * 4  # 字符串不是数
    with pytest.raises(ValueError, match=r"load\[1\]\['shares'\]"):
        plot_expert_load(runs, arm="top1")
    rows = [dict(r) for r in CAPACITY]
    rows[2]["drop_rate"] = 5.0  # 比例在 0 到 1 之间
    with pytest.raises(ValueError, match=r"capacity_rows\[2\]\['drop_rate'\]"):
        plot_capacity_drop(rows)
