"""第 8 章练习检查器：接受参考答案，拒绝每种常见错误并给出对应提示，未完成时不抛异常。"""

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


def test_stubs_report_not_done(capsys):
    for check in (check_online_softmax, check_flash_step, check_qk_flops, check_kv_cache_bytes):
        result = check(_stub)
        assert result.pending and not result.passed
        assert "尚未完成" in capsys.readouterr().out


def _fails_with(check, fn, key):
    result = check(fn)
    assert not result.passed and not result.pending
    assert result.mistake == key, (result.mistake, result.hint)


def test_online_softmax(capsys):
    assert check_online_softmax(online_ref).passed
    assert "✅" in capsys.readouterr().out
    _fails_with(check_online_softmax, online_no_max, "no_max_subtraction")
    _fails_with(check_online_softmax, online_no_rescale, "no_rescale")
    _fails_with(check_online_softmax, lambda x, b: x.softmax(0)[:-1], "shape")
    _fails_with(check_online_softmax, lambda x, b: x.softmax(0).tolist(), "type")


def test_flash_step():
    assert check_flash_step(flash_ref).passed
    _fails_with(check_flash_step, flash_no_l_rescale, "no_l_rescale")
    _fails_with(check_flash_step, flash_no_acc_rescale, "no_acc_rescale")
    _fails_with(check_flash_step, flash_normalised_acc, "normalised_acc")
    _fails_with(check_flash_step, lambda m, l, acc, s, v: (m, l), "type")
    _fails_with(check_flash_step, lambda m, l, acc, s, v: (m, acc, l), "shape")


def test_qk_flops():
    assert check_qk_flops(qk_ref).passed
    _fails_with(check_qk_flops, lambda B, tq, tk, d, h: B * h * tq * tk * (d // h), "no_factor_2")
    _fails_with(check_qk_flops, lambda B, tq, tk, d, h: 2 * B * tq * tk * (d // h), "no_heads")
    _fails_with(check_qk_flops, lambda B, tq, tk, d, h: 2 * B * h * tq * tq * (d // h), "t_q_squared")
    _fails_with(check_qk_flops, lambda B, tq, tk, d, h: 2 * B * h * tq * tk * d, "d_model_per_head")
    _fails_with(check_qk_flops, lambda B, tq, tk, d, h: "many", "type")


def test_kv_cache_bytes():
    assert check_kv_cache_bytes(kv_ref).passed
    _fails_with(check_kv_cache_bytes, lambda c, e: c.n_decoder_layers * c.d_model * e, "no_factor_2")
    _fails_with(check_kv_cache_bytes, lambda c, e: 2 * c.d_model * e, "no_layers")
    _fails_with(check_kv_cache_bytes, lambda c, e: 2 * c.n_encoder_layers * c.d_model * e, "encoder_layers")
    _fails_with(check_kv_cache_bytes, lambda c, e: 2 * c.n_decoder_layers * c.d_k * e, "d_k")
    _fails_with(check_kv_cache_bytes, lambda c, e: 2 * c.n_decoder_layers * c.d_model, "no_bytes")
    _fails_with(check_kv_cache_bytes, lambda c, e: 4 * c.n_decoder_layers * c.d_model * e, "cross_attention")


def test_reader_exceptions_do_not_raise(capsys):
    result = check_qk_flops(lambda *a: 1 / 0)
    assert not result.passed and result.mistake == "exception"
    assert "ZeroDivisionError" in capsys.readouterr().out
