"""第 13 章的图：算术强度、屋顶线、槽位时间线、块表、推测解码——内容对得上输入、中文画得出、坏输入给出清楚的错误。"""

import pytest

from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.plotting.serving import (
    block_table_snapshot,
    plot_arithmetic_intensity,
    plot_block_table,
    plot_roofline,
    plot_slot_timeline,
    plot_speculative,
    slot_utilization,
)
from tformer_lib.serving import BlockManager, Engine, PagedKVCache
from tformer_lib.serving.roofline import decode_cost, machine_balance, prefill_cost

pytestmark = pytest.mark.filterwarnings("error")

CONFIG = LMConfig(vocab_size=300, d_model=64, n_heads=4, n_layers=2, d_ff=256, max_len=64)


def test_arithmetic_intensity_lines_are_the_roofline_numbers(render):
    fig = render(plot_arithmetic_intensity(CONFIG, batch_sizes=(1, 4, 16), context=32, peak_flops=1e11, bandwidth=1e10))
    ax = fig.axes[0]
    decode, prefill = ax.get_lines()[:2]
    assert list(decode.get_ydata()) == pytest.approx([decode_cost(CONFIG, b, 32)["intensity"] for b in (1, 4, 16)])
    assert list(prefill.get_ydata()) == pytest.approx([prefill_cost(CONFIG, t)["intensity"] for t in (1, 4, 16)])
    assert ax.get_lines()[2].get_ydata()[0] == pytest.approx(machine_balance(1e11, 1e10))
    assert len(render(plot_arithmetic_intensity(CONFIG)).axes[0].get_lines()) == 2  # 不给峰值与带宽：没有平衡线
    with pytest.raises(ValueError, match="peak_flops 与 bandwidth"):
        plot_arithmetic_intensity(CONFIG, peak_flops=1e11)
    with pytest.raises(ValueError, match="batch_sizes"):
        plot_arithmetic_intensity(CONFIG, batch_sizes=[0])


def test_roofline_puts_points_on_the_roof(render):
    ax = render(plot_roofline({"解码": 0.5, "预填充": 40.0}, 1e11, 1e10, measured={"解码": 2e9})).axes[0]
    ys = [line.get_ydata()[0] for line in ax.get_lines()[1:] if len(line.get_ydata()) == 1]
    assert ys == pytest.approx([5e9, 2e9, 1e11])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("空心点：实测") for t in legend)  # 图例说明空心点是什么
    with pytest.raises(ValueError, match="peak_flops"):
        plot_roofline({"解码": 0.5}, float("inf"), 1e10)
    with pytest.raises(ValueError, match="measured"):
        plot_roofline({"解码": 0.5}, 1e11, 1e10, measured={"预填充": 1e9})  # 没有这个标签的强度
    no_measured = render(plot_roofline({"解码": 0.5}, 1e11, 1e10)).axes[0]
    assert not any("空心点" in t.get_text() for t in no_measured.get_legend().get_texts())
    with pytest.raises(ValueError, match="points"):
        plot_roofline({}, 1e11, 1e10)
    with pytest.raises(ValueError, match="bandwidth"):
        plot_roofline({"a": 1.0}, 1e11, 0)


def test_slot_timeline_from_a_real_engine_and_static_rows(render):
    model = make_lm(LMConfig(vocab_size=40, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=32)).eval()
    engine = Engine(model, max_batch=2, block_size=4)
    requests = [engine.add_request([5 + i, 6, 7], n, arrival=0.0) for i, n in enumerate((3, 6, 2, 4))]
    engine.run()
    continuous = [r.slot_steps for r in requests]
    static = [[(s, 0) for s in range(3)], [(s, 1) for s in range(6)], [(6 + s, 0) for s in range(2)],
              [(6 + s, 1) for s in range(4)]]
    stats = slot_utilization(continuous, 2)
    assert stats["busy"] <= sum(len(r.output) for r in requests) and stats["steps"] == engine.steps
    assert slot_utilization(static, 2) == {"steps": 10, "busy": 15, "utilization": 0.75}
    fig = render(plot_slot_timeline({"static": static, "continuous": continuous}, max_batch=2))
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0] == "静态批处理：10 步，槽位利用率 75%"
    assert titles[1].startswith(f"连续批处理：{stats['steps']} 步")
    render(plot_slot_timeline(continuous))  # 只给一份也行
    handover = [[(0, 0)], [(0, 0), (1, 0)]]  # 同一步里槽位 0 换了人：画成两个半格，只算一格占用
    assert slot_utilization(handover, 1) == {"steps": 2, "busy": 2, "utilization": 1.0}
    render(plot_slot_timeline(handover))
    with pytest.raises(ValueError, match="三个请求"):
        plot_slot_timeline([[(0, 0)], [(0, 0)], [(0, 0)]])
    with pytest.raises(TypeError, match="步, 槽位"):
        plot_slot_timeline([[3]])
    with pytest.raises(ValueError, match="timeline 为空"):
        plot_slot_timeline({})


def test_block_table_shows_shared_prefix_blocks_and_free_blocks(render):
    model = make_lm(LMConfig(vocab_size=40, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=32))
    cache = PagedKVCache(model, num_blocks=10, block_size=4)
    m = cache.manager
    prompt = list(range(4, 14))
    m.allocate(0, prompt)
    m.append_slots(0, len(prompt))
    m.register_prefix(0, prompt)
    assert m.allocate(1, prompt[:9] + [30]) == 8  # 两块写满的前缀共用
    snap = block_table_snapshot(m)
    m.free(0)
    assert snap["ref_count"][:2] == [2, 2] and snap["prefix_blocks"] == [0, 1] and len(snap["free"]) == 6  # 快照不随之变化
    fig = render(plot_block_table(snap, title="前缀共用"))
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert texts.count("0\n×2") == 3  # 两张块表里各一次，物理块格里一次
    assert "物理块：4/10 块在用，2 块被共用" in [ax.get_title() for ax in fig.axes]
    render(plot_block_table(cache))  # PagedKVCache 与 BlockManager 本身也可以
    render(plot_block_table(BlockManager(4, 2)))
    with pytest.raises(TypeError, match="BlockManager"):
        block_table_snapshot("cache")
    with pytest.raises(ValueError, match="快照缺少"):
        plot_block_table({"num_blocks": 4})


def test_speculative_figure_shows_measurement_beside_the_formula(render):
    result = {"cost_ratio": 0.5, "rows": [
        {"k": 1, "acceptance_rate": 0.8, "tokens_per_target_pass": 1.8, "speedup_median": 1.1, "speedups": [1.0, 1.2],
         "expected_speedup": 1.2},
        {"k": 4, "acceptance_rate": 0.6, "tokens_per_target_pass": 2.2, "speedup_median": 0.9, "speedups": [0.8, 1.0],
         "expected_speedup": 0.77},
    ]}
    fig = render(plot_speculative(result))
    assert len(fig.axes) == 3  # 三个面板各用自己的纵轴，没有共用横轴的第二根纵轴（twinx）
    left, middle, right = fig.axes
    assert [p.get_height() for p in left.patches] == pytest.approx([0.8, 0.6])
    assert left.get_ylim() == pytest.approx((0, 1.05))
    measured, formula, ceiling = middle.get_lines()
    assert list(measured.get_ydata()) == pytest.approx([1.8, 2.2])
    assert list(formula.get_ydata()) == pytest.approx([1.8, (1 - 0.6**5) / 0.4])
    assert list(ceiling.get_ydata()) == [2, 5]  # k + 1
    assert list(right.get_lines()[0].get_ydata()) == pytest.approx([1.1, 0.9])
    with pytest.raises(ValueError, match="rows"):
        plot_speculative({"rows": []})
    with pytest.raises(ValueError, match="缺"):
        plot_speculative({"rows": [{"k": 1}]})
    row = result["rows"][0]
    for key, bad in (("k", 2.7), ("k", "x"), ("acceptance_rate", "0.5"), ("acceptance_rate", 1.5),
                     ("speedup_median", float("nan")), ("speedups", [1.0, "x"])):
        with pytest.raises(ValueError, match=rf"rows'\]\[0\]\['{key}'\]"):
            plot_speculative({"rows": [{**row, key: bad}]})
    with pytest.raises(ValueError, match="cost_ratio"):
        plot_speculative({**result, "cost_ratio": "abc"})


def _tiny_lm():
    return make_lm(LMConfig(vocab_size=40, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=32)).eval()


def test_block_table_explorer_steps_through_a_real_engine():
    from tformer_lib.widgets.base import CHAPTER_FRAME_BUDGET
    from tformer_lib.widgets.serving import block_table_explorer, block_table_states

    prompt = [5, 6, 7, 8, 9, 10]
    requests = [(prompt, 8), ([11, 12], 2), (prompt + [13], 4), (prompt[:5] + [20], 3)]
    states = block_table_states(_tiny_lm(), requests, max_batch=2, block_size=2)
    assert states[-1]["finished"] == [0, 1, 2, 3] and states[-1]["held_bytes"] == 0
    assert any(max(s["snapshot"]["ref_count"]) > 1 for s in states)  # 后来的同前缀请求共用了块
    assert states == block_table_states(_tiny_lm(), requests, max_batch=2, block_size=2)  # 只由长度决定，逐帧相同
    ex = block_table_explorer(_tiny_lm(), requests, max_batch=2, block_size=2, max_frames=5)
    assert len(ex.frames) == len(ex.states) == 5 and ex.link is not None
    assert len({bytes(f.value) for f in ex.frames}) == 5
    assert ex.frame_bytes() * 1.34 < CHAPTER_FRAME_BUDGET / 4
    with pytest.raises(ValueError, match="requests 为空"):
        block_table_states(_tiny_lm(), [])


def test_slot_timeline_explorer_has_one_frame_per_max_batch():
    from tformer_lib.widgets.serving import slot_timeline_explorer

    requests = [([5 + i % 3, 6], n) for i, n in enumerate((2, 9, 3, 7, 4, 2, 8))]
    ex = slot_timeline_explorer(_tiny_lm(), requests, (1, 2, 4))
    assert len(ex.frames) == 3 and ex.controls["max_batch"].value == 2
    assert len({bytes(f.value) for f in ex.frames}) == 3
    one = ex.timelines[1]
    assert slot_utilization(one["static"], 1)["utilization"] == 1.0  # 一个槽位时两种调度一样
    with pytest.raises(ValueError, match="value"):
        slot_timeline_explorer(_tiny_lm(), requests, (1, 2), value=3)
