"""第 16 章的账本（:func:`~tformer_lib.scale.context_parallel_rows`）：每卡的激活 = 本书的激活公式在本地长度 T/cp 上的值
（与测试里独立写出的闭式相等、与 T 成正比），环形注意力与 Ulysses 的字节 = 库里与真实通信对过的公式，
环形注意力多出的缓冲 = 一次真实运行里同时在手的块；切不开的情形记在 note 里，坏参数点名。"""

import dataclasses

import pytest
import torch

from tformer_lib.lm import PRESETS
from tformer_lib.measurement.memory import lm_activation_bytes
from tformer_lib.parallel import launch
from tformer_lib.parallel import ring_attention as ring
from tformer_lib.parallel.ulysses import ulysses_payload
from tformer_lib.scale import GB, LEDGER_CHAPTERS, context_parallel_rows, format_table, ledger_table, memory_row

CONTEXT = 131072


def _by_cp(rows):
    return {r["cp"]: r for r in rows}


def test_cp1_equals_the_chapter11_row_at_the_same_context():
    # qwen2.5-7b 的 max_len 就是 128k，poem 在它自己的 max_len 以内：第 11 章的行不截断，两者应逐字节相同
    for model, context in (("qwen2.5-7b", CONTEXT), ("poem", 128)):
        row = context_parallel_rows(model, context=context, cp_sizes=(1,), micro_batch=2)[0]
        mem = memory_row(model, context=context, micro_batch=2)
        assert mem["context"] == context == row["tokens_per_gpu"]
        assert row["activations_bytes"] == mem["activations_bytes"]
        assert row["activations_checkpointed_bytes"] == mem["activations_checkpointed_bytes"]
        assert row["model_states_bytes"] == mem["model_states_bytes"] == row["model_states_zero3_bytes"]


def test_128k_is_not_clamped_to_max_len_and_the_row_says_so():
    rows = context_parallel_rows("llama-2-7b")
    assert memory_row("llama-2-7b", context=CONTEXT)["context"] == 4096  # 第 11 章截断到 max_len
    assert all(r["context"] == CONTEXT and r["max_len"] == 4096 and r["beyond_max_len"] for r in rows)
    assert all("max_len=4096" in r["note"] and "rope_scaling" in r["note"] for r in rows)
    assert _by_cp(rows)[1]["activations_bytes"] == lm_activation_bytes(PRESETS["llama-2-7b"], 1, CONTEXT, 2)["total"]
    assert all("可学习位置嵌入" in r["note"] for r in context_parallel_rows("gpt2"))  # 1024 个位置之外无位置可用
    qwen = context_parallel_rows("qwen2.5-7b", cp_sizes=(1, 2, 4))
    assert all(not r["beyond_max_len"] and r["note"] == "" for r in qwen)


def test_llama2_7b_activations_per_gpu_against_a_hand_closed_form():
    # LLaMA-2-7B（MHA、RoPE、RMSNorm、SwiGLU）快速路径、bf16，每块每词元：两个 RMSNorm 2·(2·2d + 4)、
    # 送进 W^QKV 与 W_1 的输入 2·2d、注意力 q/输出/拼接 3·2d + k、v 2·2d + logsumexp 4h、SwiGLU 4·2·d_ff。
    # 没有任何 T² 项。块外：末层 RMSNorm 4d + 4、输出层输入 2d、词元 id 8、损失 4V + 8（+ 一个 4 字节标量）、
    # RoPE 表 2·(d_k/2)·2 每位置。
    L, d, h, f, V, dk = 32, 4096, 32, 11008, 32000, 128
    per_token = L * (2 * (4 * d + 4) + 4 * d + 10 * d + 4 * h + 8 * f) + (4 * d + 4) + 2 * d + 8 + 4 * V + 8 + 2 * dk
    rows = _by_cp(context_parallel_rows("llama-2-7b", cp_sizes=(1, 2, 4, 8)))
    for cp, row in rows.items():
        n = CONTEXT // cp
        assert row["tokens_per_gpu"] == n
        assert row["activations_bytes"] == n * per_token + 4
    for cp in (2, 4, 8):  # 与 T 成正比：cp 张卡每张正好 1/cp，只差损失里那个 4 字节的标量
        assert cp * rows[cp]["activations_bytes"] - rows[1]["activations_bytes"] == 4 * (cp - 1)
        assert cp * rows[cp]["activations_checkpointed_bytes"] - rows[1]["activations_checkpointed_bytes"] == 4 * (cp - 1)


@pytest.mark.parametrize("model", ["llama-2-70b", "qwen2.5-0.5b", "poem"])
def test_every_cp_is_the_formula_at_the_local_length(model):
    if model == "poem":
        from tformer_lib.lm import load_poem_model

        config = load_poem_model()[0].config
    else:
        config = PRESETS[model]
    for row in context_parallel_rows(model, context=4096, cp_sizes=(1, 2, 4, 8), micro_batch=3):
        n = 4096 // row["cp"]
        plain = lm_activation_bytes(config, 3, n, 2)
        ckpt = lm_activation_bytes(config, 3, n, 2, checkpointing=True)
        assert row["activations_bytes"] == plain["total"]
        assert row["activations_checkpointed_bytes"] == ckpt["total"] + ckpt["recompute_peak"]


def test_the_explicit_path_is_not_used_even_if_the_config_asks_for_it():
    explicit = dataclasses.replace(PRESETS["llama-2-7b"], fast_attention=False)
    assert context_parallel_rows(explicit, context=8192) == [
        {**r, "name": "custom"} for r in context_parallel_rows("llama-2-7b", context=8192)]


def test_ring_and_ulysses_bytes_are_the_library_formulas():
    L, h, dk, B = 80, 64, 128, 2
    for row in context_parallel_rows("llama-2-70b", micro_batch=B):
        p, n = row["cp"], row["tokens_per_gpu"]
        sent = ring.ring_attention_payload(B, h, n, dk, p, 2)
        assert row["ring_sent_per_layer_bytes"] == sent["forward"] + sent["backward"]
        assert row["ring_sent_per_layer_bytes"] == ((2 * (p - 1) + 4 * p) * B * h * n * dk * 2 if p > 1 else 0)
        assert row["ring_saved_bytes"] == L * ring.ring_attention_saved_bytes(B, h, n, dk, 2)
        a2a = ulysses_payload(B, h, n, dk, 2)
        assert row["ulysses_sent_per_layer_bytes"] == (a2a["forward"] + a2a["backward"] if p > 1 else 0)
        assert row["ring_buffers_bytes"] == (8 * B * h * n * dk * 2 if p > 1 else 0)
        assert row["ring_scores_block_bytes"] == B * h * n * n * 2  # 本书实现的显式分数块：随 (T/cp)² 增长
        assert row["ulysses_scores_bytes"] == B * (h // p) * CONTEXT ** 2 * 2


def test_fits_counts_activations_ring_buffers_and_zero3_states():
    rows = _by_cp(context_parallel_rows("llama-2-7b"))
    n = rows[1]["model_states_bytes"] // 16
    for cp, row in rows.items():
        assert row["model_states_bytes"] == 16 * n and row["model_states_zero3_bytes"] == 16 * n / cp
        base = row["ring_buffers_bytes"] + row["model_states_zero3_bytes"]
        assert row["fits"] == (row["activations_bytes"] + base <= 80 * GB)
        assert row["fits_checkpointed"] == (row["activations_checkpointed_bytes"] + base <= 80 * GB)
    assert not rows[1]["fits_checkpointed"]  # 一张卡：光模型状态 16N ≈ 108 GB 就放不下
    assert rows[8]["fits_checkpointed"] and not rows[8]["fits"]  # 8 卡 + 重算放得下；不重算每卡还要 ~96 GB
    big = _by_cp(context_parallel_rows("llama-2-7b", cp_sizes=(8,), memory_bytes=200 * GB))
    assert big[8]["fits"]


def test_impossible_splits_are_reported_not_raised():
    odd = context_parallel_rows("llama-2-7b", cp_sizes=(3,))[0]
    assert "cp=3" in odd["note"] and odd["activations_bytes"] is None and odd["fits"] is None
    # 12 能被 4 整除、不能被 8 整除：按顺序切可以，之字形的环形注意力切不开；激活与 Ulysses 照算
    zig = context_parallel_rows("llama-2-7b", context=12, cp_sizes=(4,))[0]
    assert "zigzag" in zig["note"] and zig["ring_sent_per_layer_bytes"] is None and zig["ring_buffers_bytes"] is None
    assert zig["activations_bytes"] == lm_activation_bytes(PRESETS["llama-2-7b"], 1, 3, 2)["total"]
    assert zig["ulysses_sent_per_layer_bytes"] is not None and zig["fits"] is not None
    contiguous = context_parallel_rows("llama-2-7b", context=12, cp_sizes=(4,), layout="contiguous")[0]
    assert contiguous["ring_sent_per_layer_bytes"] is not None and "切不开" not in contiguous["note"]
    heads = _by_cp(context_parallel_rows("gpt2-xl", context=1000, cp_sizes=(1, 2, 5)))  # 25 个头；1000 能被 2·5 整除
    assert heads[2]["ulysses_sent_per_layer_bytes"] is None and "h=25" in heads[2]["note"]
    assert heads[5]["ulysses_sent_per_layer_bytes"] is not None and "h=25" not in heads[5]["note"]
    assert heads[2]["ring_sent_per_layer_bytes"] is not None
    assert "—" in format_table([odd, zig, heads[2]])


@pytest.mark.parametrize("kwargs,name", [
    ({"cp_sizes": (1, 0)}, "cp_sizes"), ({"cp_sizes": (True, 2)}, "cp_sizes"), ({"cp_sizes": ()}, "cp_sizes"),
    ({"context": -5}, "context"), ({"context": 0}, "context"), ({"micro_batch": 0}, "micro_batch"),
    ({"layout": "ring"}, "layout"), ({"memory_bytes": 0}, "memory_bytes"),
])
def test_bad_arguments_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        context_parallel_rows("llama-2-7b", **kwargs)


def test_alibi_is_refused_rather_than_counted_wrong():
    alibi = dataclasses.replace(PRESETS["gpt2"], positional="alibi")
    with pytest.raises(ValueError, match="ALiBi"):
        context_parallel_rows(alibi)


def test_ledger_table_16_has_one_row_per_model_and_cp():
    assert LEDGER_CHAPTERS[16] is context_parallel_rows
    models = ("poem", "llama-2-7b", "llama-2-70b")
    rows = ledger_table(16, presets=models, cp_sizes=(1, 2, 4, 8))
    assert [(r["name"], r["cp"]) for r in rows] == [(m, c) for m in models for c in (1, 2, 4, 8)]
    text = format_table(rows)
    assert text.count("\n") == len(rows)
    assert "768 GB" in text.splitlines()[5]  # llama-2-7b cp=1：不重算的激活，字节列按 GB 排
    default = ledger_table(16)
    assert len(default) == 4 * (1 + len(PRESETS))


def _ring_buffers_worker(rank, world, q, k, v, d_out):
    """一次真实的环形注意力反向：每次 ``_pass_to_next`` 时，不属于前向存下的张量、同时在手的块（传出去的 + 接收缓冲）的字节。"""
    pos = ring.sequence_positions(q.shape[-2], world, "zigzag")
    ql, kl, vl = (ring.split_sequence(x, pos)[rank].clone().requires_grad_(True) for x in (q, k, v))
    out = ring.ring_attention(ql, kl, vl)
    saved = {t.untyped_storage().data_ptr() for t in out.grad_fn.saved_tensors}
    held = []
    original = ring._pass_to_next

    def spy(tensors):
        received = original(tensors)
        alive = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in (*tensors, *received)}
        held.append(sum(b for ptr, b in alive.items() if ptr not in saved))
        return received

    ring._pass_to_next = spy
    try:
        out.backward(ring.split_sequence(d_out, pos)[rank])
    finally:
        ring._pass_to_next = original
    return max(held)


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 4])
def test_ring_buffers_equal_the_blocks_held_in_a_real_backward(world):
    B, h, d, T = 2, 4, 8, 32
    gen = torch.Generator().manual_seed(0)
    q, k, v, d_out = (torch.randn(B, h, T, d, generator=gen) for _ in range(4))  # float32：4 字节
    measured = launch(_ring_buffers_worker, world, (q, k, v, d_out), timeout=120)
    config = dataclasses.replace(PRESETS["llama-2-7b"], d_model=h * d, n_heads=h, n_layers=2, d_ff=64, vocab_size=64)
    row = context_parallel_rows(config, context=T, cp_sizes=(world,), micro_batch=B)[0]
    assert all(m * 2 // 4 == row["ring_buffers_bytes"] for m in measured)  # 账本按 bf16（2 字节）
