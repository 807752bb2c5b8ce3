"""第 9–10 章（语言模型）的图与采样探索器：内容对得上输入、中文与诗里的生僻字都画得出来、坏输入给出清楚的错误。"""

import numpy as np
import pytest
import torch

from tformer_lib.plotting.lm import (
    plot_merge_kinds,
    plot_query_attention,
    plot_sampling,
    plot_variant_costs,
    plot_variant_curves,
)

# 本文件的每个测试里，任何警告（包括缺字 “Glyph missing”）都算失败。
pytestmark = pytest.mark.filterwarnings("error")


def test_merge_kinds_draws_one_line_per_kind(render):
    fig = render(plot_merge_kinds({"字节片段": [1, 2, 2], "单字": [0, 0, 1], "多字词": [0, 0, 0]}))
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["字节片段", "单字", "多字词"]
    assert list(ax.get_lines()[1].get_ydata()) == [0, 0, 1]
    with pytest.raises(ValueError):
        plot_merge_kinds({})


def test_sampling_shows_both_distributions_and_the_poem(render):
    before = torch.tensor([0.5, 0.3, 0.2])
    after = torch.tensor([0.625, 0.375, 0.0])
    fig = render(plot_sampling(before, after, ["㑹", "春", "。"], poem="㑹春风，。"))  # 扩展 A 区的字也画得出
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert heights[:3] == pytest.approx([0.5, 0.3, 0.2]) and heights[3:] == pytest.approx([0.625, 0.375, 0.0])
    assert "2 个" in ax.get_title()  # 3 个候选里 2 个可能被采到
    assert "㑹春风" in ax.get_xlabel()
    with pytest.raises(ValueError, match="长度"):
        plot_sampling([0.5, 0.5], [1.0], ["a", "b"])


def test_query_attention_marks_the_rhyme(render):
    w = torch.softmax(torch.randn(4, 6), -1)
    fig = render(plot_query_attention(w, "客心千里倦，", [f"头{i}" for i in range(4)], marks=[4], title="注意力"))
    labels = fig.axes[0].get_xticklabels()
    assert [t.get_text() for t in labels] == list("客心千里倦，")
    assert labels[4].get_color() == "#d62728" and labels[0].get_color() != "#d62728"
    with pytest.raises(ValueError):
        plot_query_attention(w, "太短", [f"头{i}" for i in range(4)])


def _results():
    runs = [{"arm": arm, "seed": s, "evals": [{"step": 0, "valid_loss": 8.4}, {"step": 10, "valid_loss": 6.0 + s + i}]}
            for i, arm in enumerate(["baseline", "rope"]) for s in (0, 1)]
    arms = {a: {"parameters": 1000 + i, "kv_bytes_per_token": 512.0 / (i + 1), "tokens_per_second": 3000.0}
            for i, a in enumerate(["baseline", "rope"])}
    return {"runs": runs, "arms": arms, "settings": {"arms": ["baseline", "rope"]}}


def test_variant_curves_one_line_per_seed(render):
    fig = render(plot_variant_curves(_results(), {"位置": ["baseline", "rope"]}, {"baseline": "基线", "rope": "RoPE"},
                                     title="验证损失"))
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 4
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["基线", "RoPE"]
    with pytest.raises(ValueError, match="没有组"):
        plot_variant_curves(_results(), {"x": ["mqa"]})


def test_variant_costs_three_panels(render):
    r = _results()
    fig = render(plot_variant_costs(r["arms"], {"baseline": "基线"}))
    assert len(fig.axes) == 3
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["基线", "rope"]
    assert [p.get_width() for p in fig.axes[1].patches] == pytest.approx([512.0, 256.0])


def test_sampling_explorer_frames_differ_and_are_seeded():
    from tformer_lib.lm import LMConfig, make_lm
    from tformer_lib.text import CharTokenizer
    from tformer_lib.widgets.lm import SAMPLING_SETTINGS, sampling_explorer

    tok = CharTokenizer.build(["五绝《春晓》春眠不觉晓，处处闻啼鸟。"])
    torch.manual_seed(0)
    model = make_lm(LMConfig(tok.vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=16, max_len=32))
    ex = sampling_explorer(model, tok, "五绝《春晓》", settings=[0, 4])
    assert ex.frame_bytes() > 0
    assert "采样设置" in repr(ex) or ex.controls["setting"].description == "采样设置"
    assert [o[0] for o in ex.controls["setting"].options] == [SAMPLING_SETTINGS[0][0], SAMPLING_SETTINGS[4][0]]


def test_variant_costs_throughput_error_bars_span_the_rounds(render):
    arms = _results()["arms"]
    arms["baseline"]["tokens_per_second_rounds"] = [2500.0, 3000.0, 3600.0]
    arms["rope"]["tokens_per_second_rounds"] = [2900.0, 3000.0, 3100.0]
    fig = render(plot_variant_costs(arms))
    ax = fig.axes[2]
    segments = [seg for coll in ax.collections for seg in coll.get_segments()]
    spans = sorted((float(s[:, 0].min()), float(s[:, 0].max())) for s in segments if s[0, 1] == s[1, 1])
    assert [x for span in spans for x in span] == pytest.approx([2500.0, 3600.0, 2900.0, 3100.0])
    assert "最小–最大" in ax.get_title()
    assert ax.get_xlim()[1] == pytest.approx(3600.0 * 1.35)


@pytest.mark.parametrize("rounds, match", [([], "非空"), ([3100.0, 3200.0], "之间"), ([float("nan")], "有限"),
                                           (["3000"], "数值")])
def test_variant_costs_refuses_bad_rounds(rounds, match):
    arms = _results()["arms"]
    arms["rope"]["tokens_per_second_rounds"] = rounds
    with pytest.raises(ValueError, match=match):
        plot_variant_costs(arms)


@pytest.mark.parametrize("change, match", [
    (lambda a: a["rope"].update(tokens_per_second=True), r"arms\['rope'\]\['tokens_per_second'\]"),
    (lambda a: a["rope"].update(parameters=-1), "非负"),
    (lambda a: a["rope"].update(kv_bytes_per_token=float("nan")), "有限"),
    (lambda a: a["rope"].pop("tokens_per_second"), "缺"),
    (lambda a: a.update(rope=5), "rope"),
])
def test_variant_costs_names_the_arm_and_field(change, match):
    arms = _results()["arms"]
    change(arms)
    with pytest.raises(ValueError, match=match):
        plot_variant_costs(arms)


def test_variant_costs_refuses_non_mappings():
    with pytest.raises(ValueError, match="arms 应是非空的字典"):
        plot_variant_costs(None)
    with pytest.raises(TypeError, match="labels"):
        plot_variant_costs(_results()["arms"], ["A", "B"])
