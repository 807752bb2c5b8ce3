"""第 15 章的图：朴素注意力与 FlashAttention 的显存读写——线上的数就是闭式公式、中文画得出、坏输入给出清楚的错误。

画图只用闭式公式，不需要 triton。
"""

import pytest

from tformer_lib.kernels.io_bytes import flash_attention_io_bytes, naive_attention_io_bytes
from tformer_lib.plotting.kernels import attention_io_table, plot_attention_io

pytestmark = pytest.mark.filterwarnings("error")


def test_attention_io_lines_are_the_closed_forms(render):
    lengths = (64, 256, 1024)
    fig = render(plot_attention_io(lengths, d=32, block_ms=(16, 64), naive_block=32, causal=True, unit=1,
                                   counted=[(64, None, 123), (64, 16, 45)]))
    left, right = fig.axes[:2]
    naive, sp, tiled16, tiled64 = [line for line in left.get_lines() if len(line.get_xdata()) == 3]
    assert list(naive.get_ydata()) == [naive_attention_io_bytes(t, 32, 32, 32)["total"] for t in lengths]
    assert list(sp.get_ydata()) == [naive_attention_io_bytes(t, 32, 32, 32)["scores_and_weights"] for t in lengths]
    assert list(tiled64.get_ydata()) == [flash_attention_io_bytes(t, 32, 64, causal=True)["total"] for t in lengths]
    ratios = right.get_lines()[0].get_ydata()
    assert list(ratios) == pytest.approx([n / t for n, t in zip(naive.get_ydata(), tiled16.get_ydata())])
    assert ratios[-1] > ratios[0] > 1  # 越长越省
    marks = [line for line in left.get_lines() if line.get_marker() == "x" and len(line.get_xdata())]
    assert [tuple(m.get_ydata()) for m in marks] == [(123,), (45,)]
    assert "解释器里数出的字节" in [t.get_text() for t in left.get_legend().get_texts()]


def test_attention_io_table_and_bad_inputs():
    table = attention_io_table([128], 64, [64])
    assert table[64] == [flash_attention_io_bytes(128, 64, 64)["total"]] and set(table) == {"naive", "scores_and_weights", 64}
    with pytest.raises(ValueError, match="lengths"):
        plot_attention_io([])
    with pytest.raises(ValueError, match="block_ms"):
        plot_attention_io(block_ms=[0])
    with pytest.raises(ValueError, match="unit"):
        plot_attention_io(unit=0)
