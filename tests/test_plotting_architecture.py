"""结构图：能画（无缺字警告）、图里写的模块名在模型上真的存在、前言里提交的 PNG 与库函数画出的一致。"""

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.image import imread

from tformer_lib import TransformerConfig, make_model
from tformer_lib.plotting.architecture import (
    diagram_module_names,
    plot_layer_norm_placement,
    plot_transformer_architecture,
)

pytestmark = pytest.mark.filterwarnings("error")

ROOT = Path(__file__).resolve().parents[1]


def _config(norm_first):
    return TransformerConfig(src_vocab_size=11, tgt_vocab_size=13, d_model=16, n_heads=2, d_ff=32,
                             n_encoder_layers=2, n_decoder_layers=3, norm_first=norm_first)


def _resolve(model, name):
    """图中的名字 → 模型里的模块：先在模型上找，再在第一个编码器层 / 解码器层上找。"""
    if name in ("Encoder.norm", "Decoder.norm"):
        name = name.lower()
    for root in (model, model.encoder.layers[0], model.decoder.layers[0]):
        obj = root
        try:
            for part in name.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return obj
    raise AssertionError(f"图里写的 {name!r} 在模型上不存在")


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts] + [ax.get_title() for ax in fig.axes]


@pytest.mark.parametrize("norm_first", [False, True])
def test_full_diagram_names_exist_on_the_model(render, norm_first):
    cfg = _config(norm_first)
    fig = render(plot_transformer_architecture(cfg))
    names = diagram_module_names(fig)
    expected = {"src_embed", "src_pos", "tgt_embed", "tgt_pos", "self_attn", "cross_attn", "feed_forward",
                "residual_attn.norm", "residual_self.norm", "residual_cross.norm", "residual_ffn.norm", "generator"}
    assert expected <= names
    model = make_model(cfg)
    for name in names:
        _resolve(model, name)
    # pre-LN 才有栈末尾的 LayerNorm，而且它在模型里真的是 LayerNorm
    assert ({"encoder.norm", "decoder.norm"} <= names) == norm_first
    if norm_first:
        assert isinstance(model.encoder.norm, torch.nn.LayerNorm)
    text = " ".join(_texts(fig))
    assert f"编码器 {cfg.n_encoder_layers} 层、解码器 {cfg.n_decoder_layers} 层" in text
    assert "pre-LN" in text if norm_first else "post-LN" in text
    for shape in ("(B, S, d_model)", "(B, T, d_model)", "logits (B, T, V)", "memory：(B, S, d_model)"):
        assert shape in text


def test_full_diagram_default_is_the_paper_base_model(render):
    text = " ".join(_texts(render(plot_transformer_architecture())))
    assert "N = 6" in text and "d_model = 512" in text and "post-LN" in text
    assert "K、V" in text and "Q" in text  # 交叉注意力：Q 来自解码器，K、V 来自 memory


@pytest.mark.parametrize("layer, n_residual", [("encoder", 2), ("decoder", 3)])
def test_layer_diagram_post_vs_pre(render, layer, n_residual):
    fig = render(plot_layer_norm_placement(layer))
    post, pre = fig.axes
    assert "post-LN" in post.get_title() and "norm_first=False" in post.get_title()
    assert "pre-LN" in pre.get_title() and "norm_first=True" in pre.get_title()
    norms = lambda ax: [t.get_text() for t in ax.texts if t.get_text().endswith(".norm")]  # noqa: E731
    assert len(norms(post)) == n_residual  # 每个子层之后一个 LayerNorm
    assert len(norms(pre)) == n_residual + 1  # 每个子层之前一个，栈末尾再一个
    model = make_model(_config(True))
    for ax in (post, pre):
        for name in diagram_module_names(fig):
            _resolve(model, name)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="layer"):
        plot_layer_norm_placement("middle")
    with pytest.raises(TypeError, match="config"):
        plot_transformer_architecture({"d_model": 512})
    with pytest.raises(TypeError, match="norm_first"):
        plot_transformer_architecture(norm_first="yes")


def test_preface_png_matches_the_library_function():
    """前言嵌入的 PNG 必须就是库函数现在画出的图：改了函数就要重跑 scripts/render_architecture.py。"""
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_architecture", ROOT / "scripts" / "render_architecture.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    committed = imread(script.OUTPUT)
    buf = io.BytesIO()
    plot_transformer_architecture().savefig(buf, format="png", dpi=script.DPI)
    buf.seek(0)
    fresh = imread(buf)
    assert fresh.shape == committed.shape, "图的尺寸变了：运行 scripts/render_architecture.py 重画前言的图"
    # 同一版本的 matplotlib 与随书字体逐像素相同；留一点余地给别的平台上的抗锯齿差异
    changed = int((np.abs(fresh - committed).max(axis=-1) > 0.25).sum())
    assert changed <= fresh.shape[0] * fresh.shape[1] // 1000, (
        f"图的内容变了（{changed} 个像素不同）：运行 scripts/render_architecture.py 重画前言的图")
    assert "figures/transformer_architecture.png" in (ROOT / "book" / "preface.md").read_text(encoding="utf-8")
