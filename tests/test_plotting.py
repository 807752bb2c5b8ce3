"""各个 plot_* 纯函数的测试：返回 Figure、不进 pyplot 注册表、中文无缺字、数值与库一致。"""

import io
import math
import warnings

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from tformer_lib import plotting as P  # noqa: E402


def _render(fig):
    """渲染成 PNG；任何警告（包括 “Glyph … missing”）都算失败。"""
    assert isinstance(fig, Figure)
    assert fig not in [plt.figure(n) for n in plt.get_fignums()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=40)
    return fig


def _texts(fig):
    out = []
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        out += [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels() + ax.texts]
        leg = ax.get_legend()
        if leg:
            out += [t.get_text() for t in leg.get_texts()]
    if fig._suptitle is not None:
        out.append(fig._suptitle.get_text())
    return out


def _attn_weights(h=2, t=4, b=1):
    return torch.softmax(torch.randn(b, h, t, t), dim=-1)


ALL_DEFAULT_FIGURES = [
    lambda: P.plot_positional_encoding(),
    lambda: P.plot_positional_curves(),
    lambda: P.plot_positional_similarity(),
    lambda: P.plot_positional_similarity(normalize=True),
    lambda: P.plot_positional_slice(),
    lambda: P.plot_attention(_attn_weights(), "人工智能", head=1),
    lambda: P.plot_attention_grid([_attn_weights(), _attn_weights()], "人工智能"),
    lambda: P.plot_mask(torch.ones(3, 3, dtype=torch.bool).tril(), "我爱你", "我爱你"),
    lambda: P.plot_masks(),
    lambda: P.plot_softmax_temperature(),
    lambda: P.plot_dot_product_variance(d_ks=(1, 4, 16, 64), n_samples=200),
    lambda: P.plot_scaled_attention(),
    lambda: P.plot_lr_schedule(compare=[{"warmup": 8000}]),
    lambda: P.plot_label_smoothing(),
    lambda: P.plot_history({"step": [1, 2, 3], "loss": [3.0, 2.0, 1.5], "bleu": [None, None, 12.0]}),
]


@pytest.mark.parametrize("make", ALL_DEFAULT_FIGURES)
def test_every_default_figure_renders_with_chinese_and_no_warning(make):
    fig = _render(make())
    assert any(any("\u4e00" <= ch <= "\u9fff" for ch in s) for s in _texts(fig)), "图中应有中文"


def test_positional_figures_use_the_library_encoding():
    from tformer_lib import sinusoidal_positional_encoding

    fig = P.plot_positional_encoding(20, 16)
    img = fig.axes[0].images[0].get_array()
    np.testing.assert_allclose(np.asarray(img), sinusoidal_positional_encoding(20, 16).numpy(), atol=1e-6)
    fig = P.plot_positional_curves(dims=(0, 3), max_len=30, d_model=8)
    lines = fig.axes[0].get_lines()
    np.testing.assert_allclose(lines[1].get_ydata(), sinusoidal_positional_encoding(30, 8)[:, 3].numpy(), atol=1e-6)
    assert "cos" in lines[1].get_label() and "sin" in lines[0].get_label()
    with pytest.raises(ValueError, match="dims"):
        P.plot_positional_curves(dims=(8,), d_model=8)
    fig = _render(P.plot_positional_curves(dims=(0, 1, 6), max_len=30, d_model=8, stacked=True))
    assert len(fig.axes) == 2  # 两个频率：i = 0 与 i = 3
    np.testing.assert_allclose(fig.axes[1].get_lines()[0].get_ydata(),
                               sinusoidal_positional_encoding(30, 8)[:, 6].numpy(), atol=1e-6)
    assert fig.axes[0].get_title().startswith("i = 0")
    with pytest.raises(ValueError, match="position"):
        P.plot_positional_slice(position=99, max_len=10)
    with pytest.raises(ValueError, match="d_model"):
        P.plot_positional_encoding(d_model=0)


def test_similarity_depends_only_on_distance():
    fig = P.plot_positional_similarity(30, 32)
    sim = np.asarray(fig.axes[0].images[0].get_array())
    np.testing.assert_allclose(np.diag(sim), 16.0, atol=1e-4)  # 每个位置 d_model/2 对 sin²+cos²
    np.testing.assert_allclose(np.diag(sim, 3)[:-1], np.diag(sim, 3)[1:], atol=1e-3)
    cos = np.asarray(P.plot_positional_similarity(30, 32, normalize=True).axes[0].images[0].get_array())
    np.testing.assert_allclose(np.diag(cos), 1.0, atol=1e-6)


def test_attention_selects_head_and_batch_and_checks_labels():
    w = _attn_weights(h=3, t=4, b=2)
    fig = P.plot_attention(w, list("人工智能"), head=2, batch=1)
    np.testing.assert_allclose(np.asarray(fig.axes[0].images[0].get_array()), w[1, 2].numpy(), atol=1e-6)
    assert fig.axes[0].images[0].get_clim() == (0.0, 1.0)
    assert "头 2" in fig.axes[0].get_title()
    with pytest.raises(ValueError, match="head"):
        P.plot_attention(w, head=3)
    with pytest.raises(ValueError, match="query_tokens|row_labels"):
        P.plot_attention(w[0, 0], list("人工"))
    # 交叉注意力：键与查询不同长度
    cross = torch.softmax(torch.randn(2, 5), -1)
    fig = P.plot_attention(cross, ["Artificial", "Intelligence"], list("人工智能。"))
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == list("人工智能。")


def test_attention_grid_layout():
    layers = [_attn_weights(h=4), _attn_weights(h=4), _attn_weights(h=4)]
    fig = P.plot_attention_grid(layers, "人工智能", layers=[0, 2], heads=[1, 3])
    image_axes = [ax for ax in fig.axes if ax.images]
    assert len(image_axes) == 4
    np.testing.assert_allclose(np.asarray(image_axes[3].images[0].get_array()), layers[2][0, 3].numpy(), atol=1e-6)
    assert image_axes[0].get_title() == "头 1" and image_axes[0].get_ylabel() == "第 0 层"
    assert image_axes[2].get_ylabel() == "第 2 层"
    with pytest.raises(ValueError, match="layers"):
        P.plot_attention_grid(layers, layers=[3])
    with pytest.raises(TypeError, match="encoder_self"):
        P.plot_attention_grid({"encoder_self": layers})
    # 单层 (h, T, T) 也可以
    assert len([a for a in P.plot_attention_grid(layers[0][0]).axes if a.images]) == 4


def test_masks_figure_matches_library_masks():
    from tformer_lib import causal_mask

    fig = P.plot_masks((5, 3), example=1)
    a_pad, a_causal, a_used = [ax for ax in fig.axes if ax.images]
    pad = np.asarray(a_pad.images[0].get_array()).astype(bool)
    assert pad.tolist() == [[True] * 5, [True] * 3 + [False] * 2]
    assert (np.asarray(a_causal.images[0].get_array()).astype(bool) == causal_mask(5).numpy()).all()
    used = np.asarray(a_used.images[0].get_array()).astype(bool)
    expected = causal_mask(5).numpy() & np.array([True] * 3 + [False] * 2)[None, :]
    assert (used == expected).all()
    assert [t.get_text() for t in a_used.get_xticklabels()] == ["x1", "x2", "x3", "<pad>", "<pad>"]
    only_pad = P.plot_masks((5, 3), example=1, causal=False)
    used = np.asarray([ax for ax in only_pad.axes if ax.images][2].images[0].get_array()).astype(bool)
    assert used.all(axis=0).tolist() == [True] * 3 + [False] * 2 and used[0].tolist() == used[4].tolist()
    with pytest.raises(ValueError, match="tokens"):
        P.plot_masks((2, 1), tokens=[["a", "b"], ["c", "d"]])
    with pytest.raises(ValueError, match="lengths"):
        P.plot_masks((0,))
    # padding_mask 的 (B,1,1,T) 形状可以直接画
    from tformer_lib import padding_mask

    _render(P.plot_mask(padding_mask(torch.tensor([[5, 6, 0]]), 0)))


def test_softmax_temperature_numbers_match_the_chapter_example():
    fig = P.plot_softmax_temperature(temperatures=(1.0,))
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels == ["72.7%", "26.8%", "0.5%"]
    bars = [r.get_height() for r in fig.axes[0].patches]
    assert math.isclose(sum(bars), 1.0, rel_tol=1e-9)
    hot = [r.get_height() for r in P.plot_softmax_temperature(temperatures=(0.25,)).axes[0].patches]
    assert hot[0] > bars[0]
    with pytest.raises(ValueError, match="temperatures"):
        P.plot_softmax_temperature(temperatures=(0.0,))
    # 大分数不溢出
    big = [r.get_height() for r in P.plot_softmax_temperature([1000.0, 999.0], ["甲", "乙"], temperatures=(1,)).axes[0].patches]
    assert all(np.isfinite(big))


def test_dot_product_variance_grows_with_dk_and_scaling_fixes_it():
    fig = P.plot_dot_product_variance(d_ks=(1, 16, 256), n_samples=3000, seed=1)
    a1, a2 = fig.axes
    raw, scaled = a1.get_lines()[0].get_ydata(), a1.get_lines()[1].get_ydata()
    np.testing.assert_allclose(raw, [1, 16, 256], rtol=0.15)
    np.testing.assert_allclose(scaled, 1.0, rtol=0.15)
    sat_raw, sat_scaled = a2.get_lines()[0].get_ydata(), a2.get_lines()[1].get_ydata()
    assert sat_raw[-1] > 0.85 and sat_scaled[-1] < 0.5


def test_scaled_attention_saturates_without_scaling():
    def max_weight(fig):
        return max(r.get_height() for r in fig.axes[1].patches)

    assert max_weight(P.plot_scaled_attention(512, scaled=False)) > 0.95
    assert max_weight(P.plot_scaled_attention(512, scaled=True)) < 0.95
    assert max_weight(P.plot_scaled_attention(512, 100.0, scaled=False)) < max_weight(P.plot_scaled_attention(512, scaled=False))
    with pytest.raises(ValueError, match="d_k"):
        P.plot_scaled_attention(4096)


def test_lr_schedule_peaks_at_warmup_and_matches_library():
    from tformer_lib.training.schedule import noam_rate

    fig = P.plot_lr_schedule(d_model=64, warmup=100, total_steps=1000)
    line = fig.axes[0].get_lines()[0]
    x, y = line.get_xdata(), line.get_ydata()
    assert abs(x[np.argmax(y)] - 100) <= 2
    np.testing.assert_allclose(y[5], noam_rate(int(x[5]), 64, 100), rtol=1e-12)
    fig = P.plot_lr_schedule(compare=[{"warmup": 8000}, {"d_model": 128, "factor": 2}])
    assert len(fig.axes[0].get_legend().get_texts()) == 3
    with pytest.raises(ValueError, match="warmup"):
        P.plot_lr_schedule(warmup=0)


def test_label_smoothing_targets_match_the_loss_definition():
    import torch.nn.functional as F

    dist = P.label_smoothing_targets([2, 0], vocab_size=5, smoothing=0.1)
    np.testing.assert_allclose(dist.sum(1), 1.0)
    np.testing.assert_allclose(dist[0], [0.02, 0.02, 0.92, 0.02, 0.02])
    logits = torch.randn(2, 5, dtype=torch.float64)
    ce = F.cross_entropy(logits, torch.tensor([2, 0]), label_smoothing=0.1)
    mine = -(torch.from_numpy(dist) * logits.log_softmax(-1)).sum(-1).mean()
    assert torch.allclose(ce, mine)
    with pytest.raises(ValueError, match="smoothing"):
        P.label_smoothing_targets([0], 3, 1.0)
    with pytest.raises(ValueError, match="targets"):
        P.plot_label_smoothing(vocab_size=3, targets=(3,))


def test_history_accepts_both_shapes():
    rows = [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0, "val_loss": 2.5, "note": "x"}, {"step": 3, "loss": 1.0}]
    cols = P.history_to_columns(rows)
    assert set(cols) == {"step", "loss", "val_loss"}  # 非数值列被忽略
    assert np.isnan(cols["val_loss"][0]) and cols["val_loss"][1] == 2.5
    fig = P.plot_history(rows)
    assert len(fig.axes) == 1 and [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["损失", "验证损失"]
    assert fig.axes[0].get_xlabel() == "训练步数"
    fig = P.plot_history({"epoch": [1, 2], "train_loss": [2.0, 1.0], "accuracy": [0.5, 0.7], "lr": [1e-3, 5e-4]})
    assert [ax.get_title() for ax in fig.axes] == ["损失", "准确率", "学习率"]
    fig = P.plot_history({"loss": [3.0, 2.0]}, logy=True)
    assert fig.axes[0].get_yscale() == "log" and fig.axes[0].get_xlabel() == "记录序号"
    with pytest.raises(ValueError, match="等长"):
        P.history_to_columns({"loss": [1.0], "step": [1, 2]})
    with pytest.raises(TypeError):
        P.plot_history(3)
    with pytest.raises(ValueError, match="metrics"):
        P.plot_history(rows, metrics=["bleu"])


def test_history_accepts_the_trainer_history():
    from tformer_lib.training.trainer import History

    h = History.from_dict({
        "step_loss": [4.0, 3.0, 2.5, 2.0], "step_lr": [1e-4, 2e-4, 3e-4, 2.5e-4],
        "epochs": [
            {"epoch": 1, "step": 2, "train_loss": 3.5, "lr": 2e-4, "valid_loss": 3.2, "valid_bleu": 5.0, "seconds": 1.7},
            {"epoch": 2, "step": 4, "train_loss": 2.2, "lr": 2.5e-4, "valid_loss": 2.4, "valid_bleu": 11.0, "seconds": 1.6},
        ],
    })
    for src in (h, h.to_dict()):
        cols = P.history_to_columns(src)
        assert cols["step"].tolist() == [1, 2, 3, 4]
        assert cols["lr"].tolist() == [1e-4, 2e-4, 3e-4, 2.5e-4]  # 每步的学习率，不被 epoch 记录覆盖
        assert np.isnan(cols["valid_loss"][0]) and cols["valid_loss"][3] == 2.4
    fig = _render(P.plot_history(h))
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert titles == ["损失", "学习率", "验证 BLEU"]  # 耗时 seconds 不画
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["训练损失（每步）", "训练损失", "验证损失"]
    many = {"loss": [1.0, 2.0], "a": [1, 2], "b": [1, 2], "c": [1, 2]}
    fig = P.plot_history(many)
    assert len(fig.axes) == 6 and sum(ax.get_visible() for ax in fig.axes) == 4  # 每行最多 3 幅


def test_model_attention_labels_follow_the_kind(tiny_model_attention):
    att = tiny_model_attention
    src, tgt = "人工智能", ["<bos>", "Artificial", "Intelligence"]
    fig = _render(P.plot_model_attention(att, src, tgt, kind="decoder_cross", head=1))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == tgt
    assert [t.get_text() for t in ax.get_xticklabels()] == list(src)
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), att["decoder_cross"][0][0, 1].numpy(), atol=1e-6)
    assert ax.get_title().startswith("交叉注意力")
    fig = P.plot_model_attention(att, src, tgt, kind="encoder_self", layer=1)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list(src)
    with pytest.raises(ValueError, match="kind"):
        P.plot_model_attention(att, kind="cross")
    with pytest.raises(ValueError, match="layer"):
        P.plot_model_attention(att, kind="decoder_self", layer=1)
    with pytest.raises(ValueError, match="fast_attention"):
        P.plot_model_attention({**att, "decoder_cross": [None]})
    with pytest.raises(TypeError, match="attention_weights"):
        P.plot_model_attention([att["decoder_cross"]])
