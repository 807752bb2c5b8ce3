"""第 16 章长上下文的图：每种方法一条线、画的就是各种子平均后的滑动平均、爆炸的曲线被裁剪并标出、
RoPE 缩放后的波长对得上公式、中文画得出、坏输入给出点名的错误。"""

import math

import matplotlib.text
import numpy as np
import pytest

from tformer_lib.experiments.long_context import METHOD_LABELS
from tformer_lib.plotting import missing_glyphs
from tformer_lib.plotting.long_context import plot_position_loss, plot_rope_frequencies

pytestmark = pytest.mark.filterwarnings("error")


def _texts(fig) -> str:
    return "".join(t.get_text() for t in fig.findobj(matplotlib.text.Text))


def _curves(ax):
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


def _evals(explode: bool = True):
    """两个种子、两个评测长度（16、32），训练长度 8；``rope/none`` 过了位置 8 以后损失直线上升。"""
    out = []
    for seed in (0, 1):
        for length in (16, 32):
            pos = np.arange(length)
            for method in ("alibi", "rope/none", "rope/yarn"):  # 故意不按 METHOD_LABELS 的顺序
                loss = 5.0 + 0.1 * seed + 0.01 * pos
                if method == "rope/none" and explode:
                    loss = loss + np.where(pos < 8, 0.0, 1.0 * (pos - 8))
                if method == "rope/yarn":
                    loss = loss + 0.2
                out.append({"seed": seed, "method": method, "eval_len": length,
                            "position_loss": loss.tolist(), "ranges": {}})
    return out


def _moving_average(values, k):
    return [sum(values[i:i + k]) / k for i in range(len(values) - k + 1)]


def test_position_loss_is_seed_mean_then_moving_average(render):
    evals = _evals()
    fig = render(plot_position_loss(evals, eval_len=32, train_len=8, smooth=4))
    ax = fig.axes[0]
    lines = _curves(ax)
    order = ["rope/none", "rope/yarn", "alibi"]  # METHOD_LABELS 的顺序
    assert [line.get_label().split("（")[0] for line in lines] == [METHOD_LABELS[m] for m in order]
    for method, line in zip(order, lines):
        runs = [e["position_loss"] for e in evals if e["method"] == method and e["eval_len"] == 32]
        mean = [sum(v) / len(v) for v in zip(*runs)]
        assert list(line.get_ydata()) == pytest.approx(_moving_average(mean, 4))
        assert list(line.get_xdata()) == pytest.approx([i + 1.5 for i in range(29)])  # 窗口中点
    assert "4 个位置的滑动平均" in ax.get_ylabel() and "nats" in ax.get_ylabel()
    assert any(t.get_text().startswith("训练长度") for t in ax.texts)
    verticals = [line for line in ax.get_lines() if list(line.get_xdata()) == [8, 8]]
    assert len(verticals) == 1 and verticals[0].get_linestyle() == "--"
    assert missing_glyphs(_texts(fig)) == []


def test_exploding_curve_is_clipped_and_marked(render):
    fig = render(plot_position_loss(_evals(), eval_len=32, train_len=8, smooth=4))
    ax = fig.axes[0]
    lines = _curves(ax)
    low, top = ax.get_ylim()
    exploding, flat = lines[0], lines[1:]
    assert max(exploding.get_ydata()) > top  # 不缩放的 RoPE 冲出图框……
    assert "超出图框" in exploding.get_label() and f"{max(exploding.get_ydata()):.1f}" in exploding.get_label()
    for line in flat:  # ……平的曲线整条都在框里，也没有被标成超出
        assert low < min(line.get_ydata()) and max(line.get_ydata()) < top
        assert "超出" not in line.get_label()
    markers = [line for line in ax.get_lines() if line.get_marker() == "^"]
    assert len(markers) == 1 and markers[0].get_ydata()[0] == top
    assert markers[0].get_color() == exploding.get_color()
    # 上沿 = 训练长度以内最差那条曲线的中位数 + 1.5 nats，比爆炸曲线的最高点低得多
    assert top < 7.5 < max(exploding.get_ydata())
    # 给出 ymax 时用它
    assert plot_position_loss(_evals(), eval_len=32, train_len=8, smooth=4, ymax=40.0).axes[0].get_ylim()[1] == 40.0


def test_no_clipping_when_nothing_explodes(render):
    fig = render(plot_position_loss({"evals": _evals(explode=False)}, eval_len=16, train_len=8, smooth=1,
                                    methods=["alibi", "rope/yarn"], labels={"alibi": "线性偏置"}, title="短"))
    ax = fig.axes[0]
    lines = _curves(ax)
    assert [line.get_label() for line in lines] == ["线性偏置", METHOD_LABELS["rope/yarn"]]
    assert len(lines[0].get_ydata()) == 16  # smooth=1：每个位置一个点
    top = ax.get_ylim()[1]
    assert all(max(line.get_ydata()) < top for line in lines)
    assert not any(line.get_marker() == "^" for line in ax.get_lines())
    assert ax.get_ylabel() == "交叉熵（nats）" and ax.get_title() == "短"


def test_position_loss_bad_input_is_named():
    evals = _evals()
    with pytest.raises(ValueError, match="eval_len=256"):
        plot_position_loss(evals)  # 只有 16 与 32
    with pytest.raises(ValueError, match="methods"):
        plot_position_loss(evals, eval_len=32, methods=["rope/ntk"])
    with pytest.raises(TypeError, match="methods"):
        plot_position_loss(evals, eval_len=32, methods="alibi")
    with pytest.raises(ValueError, match="smooth"):
        plot_position_loss(evals, eval_len=32, smooth=0)
    with pytest.raises(TypeError, match="smooth"):
        plot_position_loss(evals, eval_len=32, smooth="8")
    with pytest.raises(ValueError, match="evals"):
        plot_position_loss([])
    with pytest.raises(ValueError, match=r"evals\[0\].*position_loss"):
        plot_position_loss([{"seed": 0, "method": "alibi", "eval_len": 32}], eval_len=32)
    evals[3]["position_loss"] = evals[3]["position_loss"][:-1]
    with pytest.raises(ValueError, match=r"evals\[3\]\['position_loss'\].*32"):
        plot_position_loss(evals, eval_len=32)
    with pytest.raises(TypeError, match="labels"):
        plot_position_loss(_evals(), eval_len=32, labels=["a"])
    with pytest.raises(ValueError, match="ymax"):
        plot_position_loss(_evals(), eval_len=32, ymax=1.0)


def test_rope_frequencies_match_the_formulas(render):
    d, base, s, length = 32, 10000.0, 4.0, 64
    fig = render(plot_rope_frequencies(d, base, s, length))
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    none, pi, ntk, yarn = _curves(ax)
    wave = [2 * math.pi * base ** (2 * i / d) for i in range(d // 2)]
    assert list(none.get_xdata()) == list(range(16))
    assert list(none.get_ydata()) == pytest.approx(wave)
    assert list(pi.get_ydata()) == pytest.approx([s * w for w in wave])  # PI：每一对 × s
    ntk_wave = [2 * math.pi * (base * s ** (d / (d - 2))) ** (2 * i / d) for i in range(d // 2)]
    assert list(ntk.get_ydata()) == pytest.approx(ntk_wave)
    assert ntk.get_ydata()[0] == pytest.approx(wave[0]) and ntk.get_ydata()[-1] == pytest.approx(s * wave[-1])
    y = yarn.get_ydata()
    assert y[0] == pytest.approx(wave[0])  # 最高频不动
    assert list(y[5:]) == pytest.approx([s * w for w in wave[5:]])  # 低频做 PI（L = 64、β = 32/1 时从 i = 5 起）
    assert all(wave[i] < y[i] < s * wave[i] for i in range(1, 5))  # 中间过渡
    assert "1.139" in yarn.get_label()  # 0.1 ln 4 + 1
    horizontal = sorted(line.get_ydata()[0] for line in ax.get_lines()
                        if line.get_label().startswith("_") and len(set(line.get_ydata())) == 1)
    assert horizontal == pytest.approx([64, 256])  # L 与 s·L
    texts = {t.get_text() for t in ax.texts}
    assert {"训练长度 L = 64", "s·L = 256", "YaRN 不动", "过渡", "YaRN 插值（× s）"} <= texts
    assert missing_glyphs(_texts(fig)) == []


def test_rope_frequencies_bad_arguments_are_named(render):
    with pytest.raises(ValueError, match="^d 应是"):
        plot_rope_frequencies(d=7)
    with pytest.raises(ValueError, match="factor"):
        plot_rope_frequencies(factor=0.5)
    with pytest.raises(ValueError, match="original_max_len"):
        plot_rope_frequencies(original_max_len=0)
    fig = render(plot_rope_frequencies(d=8, factor=1.0, title="不缩放"))  # s = 1：四条线重合，不画 YaRN 的分段
    assert fig.axes[0].get_title() == "不缩放" and len(_curves(fig.axes[0])) == 4


def test_nan_positions_are_skipped_and_inf_is_named(render):
    """NaN = 那个位置没有可计的目标：平均时跳过，整窗都没有数时曲线断开；±inf 是错误。"""
    evals = _evals(explode=False)
    rows = [e for e in evals if e["method"] == "alibi" and e["eval_len"] == 16]
    rows[0]["position_loss"][3] = float("nan")  # 种子 0 的位置 3 没有目标：那里只用种子 1
    for e in rows:
        e["position_loss"][-2:] = [float("nan")] * 2  # 最后两个位置两个种子都没有目标
    fig = render(plot_position_loss(evals, eval_len=16, train_len=8, smooth=2, methods=["alibi"]))
    y = _curves(fig.axes[0])[0].get_ydata()
    a, b = (np.array(e["position_loss"]) for e in rows)
    assert y[2] == pytest.approx((a[2] + b[2] + b[3]) / 3)  # 窗口 {2, 3} 里有 3 个数
    assert y[13] == pytest.approx((a[13] + b[13]) / 2)  # 窗口 {13, 14}：14 没有数
    assert np.isnan(y[14])  # 窗口 {14, 15} 全空：断开
    for e in rows:
        e["position_loss"] = [float("nan")] * 16
    with pytest.raises(ValueError, match="'alibi'.*NaN"):
        plot_position_loss(evals, eval_len=16, methods=["alibi"])
    evals = _evals()
    evals[1]["position_loss"][5] = float("inf")
    with pytest.raises(ValueError, match=r"evals\[1\]\['position_loss'\].*下标 5"):
        plot_position_loss(evals, eval_len=16)


@pytest.mark.parametrize("kwargs, name", [
    ({"factor": "4"}, "factor"), ({"factor": float("nan")}, "factor"), ({"base": 1.0}, "base"),
    ({"base": True}, "base"), ({"d": 2}, "d"), ({"d": 9.0}, "d"), ({"original_max_len": 64.0}, "original_max_len"),
    ({"title": 3}, "title"),
])
def test_rope_frequencies_checks_every_argument_up_front(kwargs, name):
    with pytest.raises((TypeError, ValueError), match=f"^{name}"):
        plot_rope_frequencies(**kwargs)


def test_rope_frequencies_refuses_what_it_cannot_draw():
    for kwargs in ({"base": 1e300}, {"factor": 1e300}):
        with pytest.raises(ValueError, match="太大"):
            plot_rope_frequencies(**kwargs)
