"""第 8 章练习检查器：接受参考答案，拒绝每种常见错误并给出对应提示，未完成时不抛异常。"""

import math

import torch

from tformer_lib.exercises.ch08 import check_flash_step, check_kv_cache_bytes, check_online_softmax, check_qk_flops


def _stub(*args):
    raise NotImplementedError  # 在这里写你的实现


# ---- 参考答案与错误变体 -------------------------------------------------------------------------
def online_ref(x, block_size):
    m, l = torch.tensor(float("-inf")), torch.tensor(0.0)
    for s in range(0, x.numel(), block_size):
        tile = x[s:s + block_size]
        m_new = torch.maximum(m, tile.max())
        l = l * torch.exp(m - m_new) + torch.exp(tile - m_new).sum()
        m = m_new
    return torch.exp(x - m) / l


def online_no_max(x, block_size):
    return torch.exp(x) / torch.exp(x).sum()


def online_no_rescale(x, block_size):
    m, l = torch.tensor(float("-inf")), torch.tensor(0.0)
    for s in range(0, x.numel(), block_size):
        tile = x[s:s + block_size]
        m = torch.maximum(m, tile.max())
        l = l + torch.exp(tile - m).sum()
    return torch.exp(x - m) / l


def flash_ref(m, l, acc, s, v):
    m_new = torch.maximum(m, s.max(-1).values)
    p = torch.exp(s - m_new[:, None])
    c = torch.exp(m - m_new)
    return m_new, l * c + p.sum(-1), acc * c[:, None] + p @ v


def flash_no_l_rescale(m, l, acc, s, v):
    m_new = torch.maximum(m, s.max(-1).values)
    p = torch.exp(s - m_new[:, None])
    c = torch.exp(m - m_new)
    return m_new, l + p.sum(-1), acc * c[:, None] + p @ v


def flash_no_acc_rescale(m, l, acc, s, v):
    m_new = torch.maximum(m, s.max(-1).values)
    p = torch.exp(s - m_new[:, None])
    c = torch.exp(m - m_new)
    return m_new, l * c + p.sum(-1), acc + p @ v


def flash_normalised_acc(m, l, acc, s, v):
    m_new, l_new, acc_new = flash_ref(m, l, acc, s, v)
    return m_new, l_new, acc_new / l_new[:, None]


def qk_ref(B, tq, tk, d, h):
    return 2 * B * h * tq * tk * (d // h)


def kv_ref(config, e):
    return 2 * config.n_decoder_layers * config.d_model * e


def _out(capsys):
    return capsys.readouterr().out


def test_stubs_report_not_done(capsys):
    for check in (check_online_softmax, check_flash_step, check_qk_flops, check_kv_cache_bytes):
        assert check(_stub) is False
        assert "尚未完成" in _out(capsys)


def test_online_softmax(capsys):
    assert check_online_softmax(online_ref) and "✅" in _out(capsys)
    assert not check_online_softmax(online_no_max)
    assert "溢出" in _out(capsys)
    assert not check_online_softmax(online_no_rescale)
    assert "e^{m_old − m_new}" in _out(capsys)
    assert not check_online_softmax(lambda x, b: x.softmax(0)[:-1])
    assert "形状" in _out(capsys)


def test_flash_step(capsys):
    assert check_flash_step(flash_ref) and "✅" in _out(capsys)
    assert not check_flash_step(flash_no_l_rescale)
    assert "旧的 l 要先乘修正因子" in _out(capsys)
    assert not check_flash_step(flash_no_acc_rescale)
    assert "累加器 acc 也要乘" in _out(capsys)
    assert not check_flash_step(flash_normalised_acc)
    assert "不要在这里除以 l" in _out(capsys)
    assert not check_flash_step(lambda m, l, acc, s, v: (m, l))
    assert "三个张量" in _out(capsys)


def test_qk_flops(capsys):
    assert check_qk_flops(qk_ref) and "✅" in _out(capsys)
    cases = [
        (lambda B, tq, tk, d, h: B * h * tq * tk * (d // h), "因子 2"),
        (lambda B, tq, tk, d, h: 2 * B * tq * tk * (d // h), "头数 h"),
        (lambda B, tq, tk, d, h: 2 * B * h * tq * tq * (d // h), "T_q × T_k"),
        (lambda B, tq, tk, d, h: 2 * B * h * tq * tk * d, "d_k = d_model / h"),
        (lambda B, tq, tk, d, h: "many", "整数"),
    ]
    for fn, hint in cases:
        assert not check_qk_flops(fn)
        assert hint in _out(capsys)


def test_kv_cache_bytes(capsys):
    assert check_kv_cache_bytes(kv_ref) and "✅" in _out(capsys)
    cases = [
        (lambda c, e: c.n_decoder_layers * c.d_model * e, "K 和 V 是两份"),
        (lambda c, e: 2 * c.d_model * e, "层数 N_dec"),
        (lambda c, e: 2 * c.n_encoder_layers * c.d_model * e, "n_decoder_layers"),
        (lambda c, e: 2 * c.n_decoder_layers * c.d_k * e, "不是 d_k"),
        (lambda c, e: 2 * c.n_decoder_layers * c.d_model, "bytes_per_element"),
        (lambda c, e: 4 * c.n_decoder_layers * c.d_model * e, "交叉注意力"),
    ]
    for fn, hint in cases:
        assert not check_kv_cache_bytes(fn)
        assert hint in _out(capsys)


def test_reader_exceptions_do_not_raise(capsys):
    assert not check_qk_flops(lambda *a: 1 / 0)
    assert "ZeroDivisionError" in _out(capsys)
    assert not check_online_softmax("not a function")
    assert "函数" in _out(capsys)
    assert math.isfinite(1.0)
