"""测试公共设置：单线程（2 核机器上与其他进程并行时单线程更稳）与固定种子。"""

import io
import os

# Triton 的解释器（第 15 章的内核在 CPU 上运行）只在导入 triton 之前设置才生效；torch.compile 等别的测试
# 也会导入 triton，所以在任何测试导入它之前就设好（对 CPU 上的 Inductor 没有影响）。
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def tiny_model_attention():
    """一个 2+1 层的小模型跑一次前向后留下的注意力权重（画图与控件测试共用）。"""
    from tformer_lib import TransformerConfig, make_model

    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2, d_ff=32,
                            n_encoder_layers=2, n_decoder_layers=1, dropout=0.0)
    model = make_model(cfg).eval()
    with torch.no_grad():
        model(torch.tensor([[5, 6, 7, 8]]), torch.tensor([[1, 9, 10]]))
    return model.attention_weights()


@pytest.fixture
def render():
    """把 Figure 真正栅格化成 PNG 并返回它。

    库的图不经过 pyplot，``Figure.canvas`` 是 ``FigureCanvasBase``，它的 ``draw()`` 什么也不画；
    只有真正渲染，缺字（Glyph missing）之类的警告才会出现，配合 ``filterwarnings("error")`` 才有意义。
    """

    def _render(fig):
        fig.savefig(io.BytesIO(), format="png", dpi=40)
        return fig

    return _render
