"""交互探索器的测试：默认即有图、改控件就换图、非法参数不抛异常、输出带 PNG 后备；
静态帧（网页上没有内核也能拖动）：各帧不同、jslink 连着 Stack、帧的总大小在预算内。"""

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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    assert ex.controls["layer"].max == 2 and list(ex.controls["head"].options) == [("0", 0), ("1", 1)]
    with pytest.raises(ValueError, match="layer"):
        W.attention_explorer(w, layer=3)


@pytest.mark.slow
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


# ---- 静态帧：发布的 HTML 书里没有内核，靠 jslink(控件.index → Stack.selected_index) 换预先画好的帧 ----

STATIC_DEFAULTS = {  # 每个章节探索器默认的静态控件
    "positional_encoding_explorer": (W.positional_encoding_explorer, "position"),
    "softmax_scaling_explorer": (W.softmax_scaling_explorer, "d_k"),
    "softmax_temperature_explorer": (W.softmax_temperature_explorer, "temperature"),
    "mask_explorer": (W.mask_explorer, "len_b"),
    "lr_schedule_explorer": (W.lr_schedule_explorer, "warmup"),
    "attention_explorer": (lambda: W.attention_explorer(_weights(h=4), "人工智能"), "head"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", STATIC_DEFAULTS)
def test_static_frames_differ_are_jslinked_and_fit_the_budget(name):
    make, static = STATIC_DEFAULTS[name]
    ex = make()
    assert ex.static == static
    ctl = ex.controls[static]
    assert hasattr(ctl, "index") and len(ctl.options) == len(ex.frames) >= 2
    pngs = [bytes(f.value) for f in ex.frames]
    assert all(p.startswith(PNG) for p in pngs)
    assert len(set(pngs)) == len(pngs)  # 每一档一张不同的图
    # 浏览器里换帧的是 jslink（不是 Python 回调）：控件的 index 连着 Stack 的 selected_index
    assert isinstance(ex.stack, widgets.Stack) and list(ex.stack.children) == ex.frames
    assert ex.link._model_name == "LinkModel"  # 前端的 jslink，不是 Python 一侧的 traitlets.link
    assert ex.link.source == (ctl, "index") and ex.link.target == (ex.stack, "selected_index")
    assert ex.stack.selected_index == ctl.index and ex.stack in ex.children  # 显示的是盒子里的 Stack
    # 每一帧就是那一档参数的图
    i = (ctl.index + 1) % len(ex.frames)
    value = ex._option_values()[i]
    assert pngs[i] == W.figure_to_png(ex.figure(**{static: value}), colors=256)
    # 大小：一章可能有两三个探索器，每个默认探索器的帧（存进笔记本后 ×1.34）不超过一章预算的一半
    assert ex.frame_bytes() * 1.34 <= W.CHAPTER_FRAME_BUDGET / 2, ex.frame_bytes()


@pytest.mark.slow
def test_static_explorer_still_computes_live_in_a_kernel():
    ex = W.softmax_scaling_explorer()
    frames_before = [bytes(f.value) for f in ex.frames]
    ex.update(scaled=False)  # 非静态控件：当前帧按新参数重画，其他帧留待选中时再画
    i = ex.index
    assert bytes(ex.frames[i].value) != frames_before[i]
    assert [bytes(f.value) for j, f in enumerate(ex.frames) if j != i] == frames_before[:i] + frames_before[i + 1:]
    ex.update(d_k=1024)  # 静态控件：Stack 跟着换帧，这一帧也按 scaled=False 重画
    assert ex.stack.selected_index == ex.index == ex._option_values().index(1024)
    assert bytes(ex.image.value) == W.figure_to_png(ex.figure(), colors=256)
    assert bytes(ex.image.value) != frames_before[ex.index]
    ex.update(d_k=64)  # 回到一帧：它已按当前参数画过，不必再画
    assert ex.status.value == ""
    with pytest.raises(ValueError, match="不是可选的取值"):
        ex.update(d_k=3)


def test_make_explorer_picks_a_static_control_and_converts_numeric_sliders():
    step = widgets.IntSlider(value=2, min=1, max=6, description="第几步")
    temp = widgets.FloatLogSlider(value=1.0, base=10, min=-1, max=1, description="温度")
    ex = W.make_explorer(lambda step, temperature: plot_positional_curves(8 * step, dims=(0, 1)),
                         {"temperature": temp, "step": step})
    assert ex.static == "step"  # 浮点滑块不自动选（档位不明确），整数滑块 1…6 可以
    ctl = ex.controls["step"]
    assert isinstance(ctl, widgets.SelectionSlider) and ctl.description == "第几步" and ctl.value == 2
    assert [v for _, v in ctl.options] == [1, 2, 3, 4, 5, 6] and len(ex.frames) == 6
    assert ex.controls["temperature"] is temp
    ex2 = W.make_explorer(lambda temperature: plot_positional_curves(16, dims=(0,)),
                          {"temperature": widgets.FloatLogSlider(value=0.3, base=10, min=-1, max=1)},
                          static="temperature", static_values=[0.1, 1.0, 10.0])
    assert [v for _, v in ex2.controls["temperature"].options] == [0.1, 0.3, 1.0, 10.0]  # 当前值也保留
    big = W.make_explorer(plot_positional_curves, {"d_model": widgets.IntSlider(value=64, min=8, max=256, step=8)},
                          fixed={"dims": (0, 1)})
    assert big.static is None and big.stack is None  # 32 档太多：不自动预先画帧
    with pytest.raises(ValueError, match="static"):
        W.make_explorer(plot_positional_curves, {"d_model": widgets.IntSlider(value=8, min=8, max=16)}, static="nope")


def test_static_frame_of_an_invalid_combination_shows_the_reason():
    ex = W.make_explorer(plot_positional_curves, {"d_model": widgets.SelectionSlider(options=[8, 64], value=64)},
                         fixed={"dims": (0, 40)}, static="d_model")
    assert ex.status.value == "" and all(bytes(f.value).startswith(PNG) for f in ex.frames)
    ex.update(d_model=8)  # 维度 40 超出 d_model=8：那一帧是一张写着原因的图，状态行也写出原因
    assert "dims" in ex.status.value


def _notebook_frame_bytes(path):
    """笔记本里存下的小部件状态中，所有 Image 的字节数（base64 解码前）。"""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    total = 0
    for model in state.values():
        if model.get("model_name") == "ImageModel":
            total += sum(len(b.get("data", "")) for b in model.get("buffers", []))
            value = model.get("state", {}).get("value")
            total += len(value) if isinstance(value, str) else 0
    return total


@pytest.mark.parametrize("path", sorted(__import__("pathlib").Path(__file__).parent.parent.glob("notebooks/*.ipynb")),
                         ids=lambda p: p.name)
def test_each_chapter_keeps_its_stored_frames_within_the_budget(path):
    assert _notebook_frame_bytes(path) <= W.CHAPTER_FRAME_BUDGET
