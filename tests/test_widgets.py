"""交互探索器的测试：默认即有图、改控件就换图、非法参数不抛异常、输出带 PNG 后备。"""

import base64

import matplotlib

matplotlib.use("Agg")

import ipywidgets as widgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from tformer_lib import widgets as W  # noqa: E402
from tformer_lib.plotting import plot_positional_curves  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def _weights(layers=2, h=3, t=4):
    return [torch.softmax(torch.randn(1, h, t, t), -1) for _ in range(layers)]


EXPLORERS = [
    W.positional_encoding_explorer,
    W.softmax_scaling_explorer,
    W.softmax_temperature_explorer,
    W.mask_explorer,
    W.lr_schedule_explorer,
    lambda: W.attention_explorer(_weights(), "人工智能"),
]


@pytest.mark.parametrize("make", EXPLORERS)
def test_each_explorer_shows_its_default_figure_and_a_static_fallback(make):
    ex = make()
    assert isinstance(ex, widgets.VBox) and isinstance(ex, W.Explorer)
    assert bytes(ex.image.value).startswith(PNG)
    assert ex.status.value == ""
    bundle = ex._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert base64.b64decode(bundle["image/png"]).startswith(PNG)  # 没有控件前端时显示这张图
    assert bundle["text/plain"].startswith("<探索器：")  # 稳定文本：nbval 比较它
    assert "0x" not in bundle["text/plain"]
    assert isinstance(ex.figure(), Figure)
    assert plt.get_fignums() == []  # 不在 pyplot 注册表里留图


def test_changing_a_control_replaces_the_image():
    ex = W.softmax_scaling_explorer()
    before = bytes(ex.image.value)
    ex.update(scaled=False, d_k=1024)
    assert ex.params()["scaled"] is False and ex.params()["d_k"] == 1024
    assert bytes(ex.image.value) != before
    max_w = max(r.get_height() for r in ex.figure().axes[1].patches)
    assert max_w > 0.95  # 不缩放、d_k 大：饱和
    with pytest.raises(ValueError, match="没有名为"):
        ex.update(nope=1)


def test_positional_explorer_keeps_dimension_valid_when_d_model_shrinks():
    ex = W.positional_encoding_explorer(dimension=60, d_model=64)
    ex.update(d_model=16)
    assert ex.controls["dimension"].max == 15 and ex.controls["dimension"].value <= 15
    assert ex.status.value == ""


def test_invalid_parameters_show_a_message_instead_of_raising():
    ex = W.make_explorer(plot_positional_curves, {"d_model": widgets.IntSlider(value=64, min=1, max=128)},
                         fixed={"dims": (0, 40)})
    good = bytes(ex.image.value)
    ex.update(d_model=8)  # 维度 40 超出 d_model=8
    assert "dims" in ex.status.value and bytes(ex.image.value) == good
    ex.update(d_model=64)
    assert ex.status.value == ""


def test_attention_explorer_switches_layer_and_head():
    w = _weights(layers=3, h=2)
    ex = W.attention_explorer(w, list("人工智能"), layer=2, head=1)
    fig = ex.figure()
    import numpy as np

    np.testing.assert_allclose(np.asarray(fig.axes[0].images[0].get_array()), w[2][0, 1].numpy(), atol=1e-6)
    assert fig.axes[0].get_title() == "第 2 层 · 头 1 的注意力权重"
    assert ex.controls["layer"].max == 2 and ex.controls["head"].max == 1
    with pytest.raises(ValueError, match="layer"):
        W.attention_explorer(w, layer=3)


def test_mask_and_lr_explorers_pass_their_controls_through():
    ex = W.mask_explorer()
    ex.update(len_a=3, example=0, causal=False)
    fig = ex.figure()
    panels = [ax for ax in fig.axes if ax.images]
    assert panels[2].get_title().endswith("填充")
    lr = W.lr_schedule_explorer()
    lr.update(warmup=2000)
    assert lr.params() == {"total_steps": 20000, "d_model": 512, "warmup": 2000, "factor": 1.0}
    with pytest.raises(ValueError, match="lengths"):
        W.mask_explorer((0, 3))
    with pytest.raises(ValueError, match="d_model"):
        W.lr_schedule_explorer(d_model=500)
    with pytest.raises(TypeError, match="controls"):
        W.make_explorer(plot_positional_curves, {"d_model": widgets.Button(description="x")})


def test_model_attention_explorer_switches_kind_and_clamps_layer(tiny_model_attention):
    att = tiny_model_attention
    ex = W.model_attention_explorer(att, "人工智能", ["<bos>", "Artificial", "Intelligence"], kind="encoder_self", layer=1)
    assert ex.controls["layer"].max == 1
    ex.update(kind="decoder_self")
    assert ex.controls["layer"].max == 0 and ex.controls["layer"].value == 0 and ex.status.value == ""
    assert ex.figure().axes[0].get_title().startswith("解码器自注意力")
    with pytest.raises(ValueError, match="kind"):
        W.model_attention_explorer({"encoder_self": att["encoder_self"]}, kind="decoder_cross")
