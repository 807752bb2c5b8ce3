"""解码：贪心、束搜索、采样，以及 K/V 缓存与不缓存的逐步等价。"""

import pytest
import torch

from tformer_lib import TransformerConfig, make_model
from tformer_lib.data import Vocab
from tformer_lib.translation.decoding import (
    beam_search,
    decoder_step_logits,
    greedy_decode,
    ids_to_lists,
    sample_decode,
    sequence_log_probs,
    translate,
)
from tformer_lib.parts.masks import padding_mask
from tformer_lib.specials import BOS, EOS, PAD


def _model(positional="sinusoidal", norm_first=False, seed=0):
    torch.manual_seed(seed)
    cfg = TransformerConfig(20, 23, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2,
                            dropout=0.1, max_len=80, positional=positional, norm_first=norm_first)
    return make_model(cfg).eval()


def _src(B=3, S=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 20, (B, S), generator=g)
    src[1, 5:] = PAD  # 第二句较短
    return src


@pytest.mark.parametrize("positional,norm_first", [("sinusoidal", False), ("learned", True), ("none", False)])
def test_cached_logits_equal_uncached_at_every_step(positional, norm_first):
    model = _model(positional, norm_first)
    src = _src()
    tgt = torch.cat([torch.full((3, 1), BOS), torch.randint(4, 23, (3, 9))], dim=1)  # (B, T) 含 BOS
    with torch.no_grad():
        full = model(src, tgt)  # (B, T, V) 一次前向
        src_mask = padding_mask(src)
        memory = model.encode(src, src_mask)
        cache = model.new_cache()
        for t in range(tgt.shape[1]):
            cached = decoder_step_logits(model, memory, src_mask, tgt[:, t : t + 1], cache)  # (B, V)
            uncached = decoder_step_logits(model, memory, src_mask, tgt[:, : t + 1])  # (B, V)
            assert torch.allclose(cached, uncached, atol=1e-5), f"step {t}"
            assert torch.allclose(cached, full[:, t], atol=1e-5), f"step {t}"
        assert cache.length == tgt.shape[1]


def test_greedy_cached_equals_uncached_and_respects_padding():
    model = _model()
    src = _src()
    a = greedy_decode(model, src, max_len=12)
    b = greedy_decode(model, src, max_len=12, use_cache=False)
    assert torch.equal(a, b)
    # 批量解码与逐句解码一致（填充掩码生效）
    alone = greedy_decode(model, src[1:2, :5], max_len=12)
    assert ids_to_lists(a[1:2]) == ids_to_lists(alone)


def test_greedy_stops_at_eos_and_pads_after():
    model = _model()
    with torch.no_grad():
        model.generator.proj.bias[EOS] = 100.0  # 迫使第一步就输出 EOS
    out = greedy_decode(model, _src(), max_len=10)
    assert out.tolist() == [[EOS]] * 3
    assert ids_to_lists(out) == [[], [], []]
    full = greedy_decode(model, _src(), max_len=10, stop_at_eos=False)
    assert full.shape == (3, 10)


def test_sequence_log_probs_matches_a_manual_sum():
    model = _model()
    src = _src()
    out = greedy_decode(model, src, max_len=6)
    lp = sequence_log_probs(model, src, out)
    for i in range(3):
        seq = [t for t in out[i].tolist() if t != PAD]
        tgt_in = torch.tensor([[BOS] + seq[:-1]])
        with torch.no_grad():
            ref = model(src[i : i + 1], tgt_in).log_softmax(-1)[0]
        assert abs(lp[i].item() - sum(ref[j, t].item() for j, t in enumerate(seq))) < 1e-4
    with pytest.raises(ValueError, match="out"):
        sequence_log_probs(model, src, out[:1])


def test_finish_pads_after_first_eos():
    ids = torch.tensor([[5, EOS, 7, EOS], [5, 6, 7, 8]])
    assert ids_to_lists(ids) == [[5], [5, 6, 7, 8]]


def test_beam_size_one_equals_greedy_and_beam_scores_at_least_greedy():
    model = _model()
    src = _src()
    greedy = greedy_decode(model, src, max_len=8)
    beam1 = beam_search(model, src, beam_size=1, max_len=8, length_penalty=0.0)
    assert ids_to_lists(beam1) == ids_to_lists(greedy)

    def logprob(row_src, seq):  # 含 EOS（若有）的整句 log 概率
        tgt_in = torch.tensor([[BOS] + seq[:-1]]) if seq else torch.tensor([[BOS]])
        with torch.no_grad():
            lp = model(row_src[None], tgt_in).log_softmax(-1)[0]
        return sum(lp[i, t].item() for i, t in enumerate(seq))

    beam = beam_search(model, src, beam_size=5, max_len=8, length_penalty=0.0)
    for i in range(3):
        g = [t for t in greedy[i].tolist() if t != PAD]
        b = [t for t in beam[i].tolist() if t != PAD]
        if g and g[-1] == EOS and b and b[-1] == EOS:
            assert logprob(src[i], b) >= logprob(src[i], g) - 1e-4


class _ScriptedModel(torch.nn.Module):
    """假模型：下一个词的分布由已生成的前缀查表决定（词表 0..5：PAD BOS EOS a b c）。"""

    TABLE = {  # 前缀（不含 BOS）→ {词: 概率}
        (): {3: 0.5, 4: 0.3, 5: 0.2},
        (3,): {3: 0.9, EOS: 0.1},
        (4,): {EOS: 0.9, 3: 0.1},
        (5,): {EOS: 0.9, 3: 0.1},
        (3, 3): {EOS: 0.9, 3: 0.1},
    }

    class _Cache:
        def __init__(self):
            self.seqs, self.length = None, 0

        def reorder(self, index):
            self.seqs = [list(self.seqs[i]) for i in index.tolist()]

    def __init__(self):
        super().__init__()
        self.config = type("C", (), {"pad_id": PAD})()
        self._current = []

    def new_cache(self):
        return self._Cache()

    def encode(self, src, src_mask=None):
        return torch.zeros(src.shape[0], src.shape[1], 1)

    def decode(self, memory, tgt_in, src_mask=None, tgt_mask=None, cache=None):
        if cache.seqs is None:
            cache.seqs = [[] for _ in range(tgt_in.shape[0])]
        for row, tok in zip(cache.seqs, tgt_in[:, -1].tolist()):
            row.append(tok)
        cache.length += 1
        self._current = [tuple(r[1:]) for r in cache.seqs]
        return torch.zeros(tgt_in.shape[0], 1, 1)

    def generator(self, hidden):
        logits = torch.full((len(self._current), 1, 6), -30.0)
        for i, prefix in enumerate(self._current):
            for tok, p in self.TABLE.get(prefix, {EOS: 1.0}).items():
                logits[i, 0, tok] = torch.log(torch.tensor(p))
        return logits


def test_beam_does_not_stop_before_the_best_hypothesis_can_finish():
    """回归测试：早先的实现凑够 beam_size 个已结束候选（b EOS、a EOS）就停，
    丢掉了仍存活、总分更高的 a a EOS（log 概率 -0.90 对 -1.31）。"""
    out = beam_search(_ScriptedModel(), torch.tensor([[4, 5]]), beam_size=2, max_len=5, length_penalty=0.0)
    assert ids_to_lists(out) == [[3, 3]]
    greedy = beam_search(_ScriptedModel(), torch.tensor([[4, 5]]), beam_size=1, max_len=5, length_penalty=0.0)
    assert ids_to_lists(greedy) == [[3, 3]]


def test_sampling_top1_is_greedy_and_generator_makes_it_reproducible():
    model = _model()
    src = _src()
    assert torch.equal(sample_decode(model, src, max_len=8, top_k=1), greedy_decode(model, src, max_len=8))
    s1 = sample_decode(model, src, max_len=8, temperature=1.5, top_k=5, generator=torch.Generator().manual_seed(3))
    s2 = sample_decode(model, src, max_len=8, temperature=1.5, top_k=5, generator=torch.Generator().manual_seed(3))
    assert torch.equal(s1, s2)
    assert torch.equal(sample_decode(model, src, max_len=8, temperature=0), greedy_decode(model, src, max_len=8))
    with pytest.raises(ValueError, match="temperature"):
        sample_decode(model, src, temperature=-0.5)
    with pytest.raises(ValueError, match="top_k"):
        sample_decode(model, src, top_k=0)


def test_decoding_restores_training_mode_and_validates():
    model = _model().train()
    greedy_decode(model, _src(), max_len=3)
    assert model.training
    with pytest.raises(ValueError, match="src"):
        greedy_decode(model, torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="src"):
        greedy_decode(model, [[4, 5]])
    with pytest.raises(ValueError, match="max_len"):
        greedy_decode(model, _src(), max_len=0)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, _src(), beam_size=0)


def test_translate_strings():
    src_v = Vocab([f"w{i}" for i in range(16)])
    tgt_v = Vocab([f"e{i}" for i in range(19)])
    model = _model()
    one = translate(model, "w1 w2 w3", src_v, tgt_v, max_len=5)
    assert isinstance(one, str)
    many = translate(model, ["w1 w2 w3", "w4"], src_v, tgt_v, method="beam", beam_size=3, max_len=5)
    assert isinstance(many, list) and len(many) == 2
    with pytest.raises(ValueError, match="method"):
        translate(model, "w1", src_v, tgt_v, method="topp")


# ---- 不生成 PAD/BOS；有无缓存逐词相同（随机未训练模型上的性质测试）-----------------------------------

_SHAPES = [  # (d_model, n_heads, d_ff, 编码器层数, 解码器层数, 位置编码, pre-LN)
    (16, 2, 32, 1, 1, "sinusoidal", False),
    (32, 4, 64, 2, 2, "learned", True),
    (24, 3, 48, 1, 2, "none", False),
    (32, 8, 32, 2, 1, "sinusoidal", True),
]
_SEEDS = range(32)


def _random_model(seed):
    d_model, n_heads, d_ff, n_enc, n_dec, positional, norm_first = _SHAPES[seed % len(_SHAPES)]
    torch.manual_seed(seed)
    V = 6 + seed % 9  # 词表很小时 PAD/BOS 更容易拿到最高分
    cfg = TransformerConfig(12, V, d_model=d_model, n_heads=n_heads, d_ff=d_ff, n_encoder_layers=n_enc,
                            n_decoder_layers=n_dec, dropout=0.1, max_len=40, positional=positional,
                            norm_first=norm_first)
    model = make_model(cfg).eval()
    if seed % 2 == 0:  # 一半的模型把最高分偏向 PAD 或 BOS：修复前它们会生成 PAD
        with torch.no_grad():
            model.generator.proj.bias[PAD if seed % 4 == 0 else BOS] += 5.0
    g = torch.Generator().manual_seed(1000 + seed)
    B, S = 1 + seed % 3, 2 + seed % 6
    src = torch.randint(4, 12, (B, S), generator=g)
    if B > 1:
        src[-1, S // 2 + 1:] = PAD  # 最后一句较短
    return model, src


def _no_specials(out):
    return not bool(((out == BOS) | ((out == PAD).cumsum(1) > 0) & ~_after_eos(out)).any())


def _after_eos(out):
    is_eos = (out == EOS).int()
    return (is_eos.cumsum(1) - is_eos) > 0  # 第一个 EOS 之后（那里按约定补 PAD）


@pytest.mark.parametrize("seed", _SEEDS)
def test_cache_never_changes_tokens_and_no_pad_or_bos_is_generated(seed):
    model, src = _random_model(seed)
    g_cached = greedy_decode(model, src, max_len=10)
    g_plain = greedy_decode(model, src, max_len=10, use_cache=False)
    assert torch.equal(g_cached, g_plain)
    s_cached = sample_decode(model, src, max_len=10, temperature=1.3, generator=torch.Generator().manual_seed(seed))
    s_plain = sample_decode(model, src, max_len=10, temperature=1.3, generator=torch.Generator().manual_seed(seed),
                            use_cache=False)
    assert torch.equal(s_cached, s_plain)
    b_cached = beam_search(model, src, beam_size=3, max_len=10)
    b_plain = beam_search(model, src, beam_size=3, max_len=10, use_cache=False)
    assert torch.equal(b_cached, b_plain)
    for out in (g_cached, s_cached, b_cached):
        assert _no_specials(out), out
        assert len(ids_to_lists(out)) == src.shape[0]


def test_pad_and_bos_are_never_generated_even_when_they_score_highest():
    model = _model()
    with torch.no_grad():
        model.generator.proj.bias[PAD] = 100.0
        model.generator.proj.bias[BOS] = 90.0
    src = _src()
    for out in (greedy_decode(model, src, max_len=6), beam_search(model, src, beam_size=3, max_len=6),
                sample_decode(model, src, max_len=6, generator=torch.Generator().manual_seed(0)),
                greedy_decode(model, src, max_len=6, stop_at_eos=False)):
        assert not bool(((out == PAD) | (out == BOS)).any()), out
        assert out.shape[1] == 6  # 没有 EOS 的句子生成满 max_len 个真实词


def test_default_length_is_capped_by_the_model_and_too_long_max_len_is_a_clear_error():
    torch.manual_seed(0)
    cfg = TransformerConfig(20, 23, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1,
                            dropout=0.0, max_len=12)
    model = make_model(cfg).eval()
    with torch.no_grad():
        model.generator.proj.bias[EOS] = -100.0  # 永不结束：生成长度就是上限
    src = torch.randint(4, 20, (2, 12))  # 合法的最长源句；默认 S + 10 = 22 > max_len
    assert greedy_decode(model, src).shape == (2, 12)
    assert sample_decode(model, src, generator=torch.Generator().manual_seed(0)).shape == (2, 12)
    assert beam_search(model, src, beam_size=2).shape == (2, 12)
    assert greedy_decode(model, src, max_len=12).shape == (2, 12)
    for fn in (greedy_decode, sample_decode):
        with pytest.raises(ValueError, match=r"max_len=13.*config\.max_len=12"):
            fn(model, src, max_len=13)
    with pytest.raises(ValueError, match=r"max_len=13"):
        beam_search(model, src, max_len=13)
    # 不加位置编码的模型没有位置上限
    cfg_none = TransformerConfig(20, 23, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1,
                                 dropout=0.0, max_len=12, positional="none")
    model_none = make_model(cfg_none).eval()
    with torch.no_grad():
        model_none.generator.proj.bias[EOS] = -100.0
    assert greedy_decode(model_none, src).shape == (2, 22)


def test_translate_reports_unknown_words():
    from tformer_lib.translation.decoding import UnknownTokenError, UnknownTokenWarning

    src_v = Vocab([f"w{i}" for i in range(16)])
    tgt_v = Vocab([f"e{i}" for i in range(19)])
    model = _model()
    with pytest.warns(UnknownTokenWarning, match=r"词表外的词 \['。', 'zz'\]（2/3 句，如 'w1 。' 中的 \['。'\]）"):
        out = translate(model, ["w1 。", "w2", "zz w3"], src_v, tgt_v, max_len=3)
    assert len(out) == 3
    with pytest.raises(UnknownTokenError, match=r"sentences 里有词表外的词 \['zz'\]（'zz w3'）.*on_unknown='warn'"):
        translate(model, "zz w3", src_v, tgt_v, max_len=3, on_unknown="error")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        translate(model, "zz w3", src_v, tgt_v, max_len=3, on_unknown="ignore")
        translate(model, "w1 w3", src_v, tgt_v, max_len=3)  # 全是已知词：不警告
    with pytest.raises(ValueError, match="on_unknown"):
        translate(model, "w1", src_v, tgt_v, on_unknown="loud")
