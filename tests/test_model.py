import pytest
import torch

from tformer_lib import (
    PAD,
    EncoderLayer,
    PositionwiseFeedForward,
    TokenEmbedding,
    TransformerConfig,
    count_parameters,
    make_model,
    padding_mask,
)


def small_config(**overrides):
    base = dict(src_vocab_size=30, tgt_vocab_size=25, d_model=32, n_heads=4, d_ff=64,
                n_encoder_layers=2, n_decoder_layers=2, dropout=0.0, max_len=40)
    base.update(overrides)
    return TransformerConfig(**base)


def test_output_shapes_of_every_part():
    model = make_model(small_config()).eval()
    src = torch.randint(4, 30, (3, 7))
    tgt = torch.randint(4, 25, (3, 5))
    memory = model.encode(src)
    assert memory.shape == (3, 7, 32)
    assert model.decode(memory, tgt).shape == (3, 5, 32)
    assert model(src, tgt).shape == (3, 5, 25)
    assert TokenEmbedding(10, 8)(torch.tensor([[1, 2]])).shape == (1, 2, 8)
    assert PositionwiseFeedForward(8, 16, activation="gelu")(torch.randn(2, 3, 8)).shape == (2, 3, 8)
    weights = model.attention_weights()
    assert weights["encoder_self"][0].shape == (3, 4, 7, 7)
    assert weights["decoder_self"][1].shape == (3, 4, 5, 5)
    assert weights["decoder_cross"][0].shape == (3, 4, 5, 7)


def test_embedding_is_scaled_by_sqrt_d_model():
    emb = TokenEmbedding(10, 16)
    tokens = torch.tensor([[3, 4]])
    torch.testing.assert_close(emb(tokens), emb.lut(tokens) * 4.0)


def test_decoder_is_causal():
    model = make_model(small_config()).eval()
    src = torch.randint(4, 30, (2, 6))
    tgt = torch.randint(4, 25, (2, 8))
    changed = tgt.clone()
    changed[:, 5:] = torch.randint(4, 25, (2, 3))
    a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


def test_source_padding_is_ignored():
    model = make_model(small_config()).eval()
    src = torch.tensor([[5, 6, 7, PAD, PAD]])
    tgt = torch.randint(4, 25, (1, 4))
    other = src.clone()
    other[0, 3:] = torch.tensor([9, 9])
    torch.testing.assert_close(model(src, tgt), model(other, tgt, src_mask=padding_mask(src)))


def test_fast_and_explicit_model_paths_agree():
    model = make_model(small_config()).eval()
    src = torch.tensor([[5, 6, 7, PAD], [5, 6, 7, 8]])
    tgt = torch.tensor([[4, 5, PAD], [4, 5, 6]])
    explicit = model(src, tgt)
    model.set_fast_attention(True)
    assert (model(src, tgt) - explicit).abs().max().item() <= 1e-5
    assert model.attention_weights()["encoder_self"][0] is None


def test_kv_cache_gives_the_same_logits_at_every_step():
    model = make_model(small_config()).eval()
    src = torch.tensor([[5, 6, 7, PAD], [5, 6, 7, 8]])
    tgt = torch.randint(4, 25, (2, 6))
    full = model(src, tgt)
    src_mask = padding_mask(src)
    memory = model.encode(src, src_mask)
    cache = model.new_cache()
    for t in range(6):
        step = model.generator(model.decode(memory, tgt[:, t : t + 1], src_mask, cache=cache))
        torch.testing.assert_close(step[:, 0], full[:, t], atol=1e-5, rtol=1e-5)
    assert cache.length == 6 and cache.self_attn[0].k.shape == (2, 4, 6, 8)


def test_post_ln_and_pre_ln_structure():
    x = torch.randn(2, 5, 16) * 3 + 1
    post = EncoderLayer(16, 4, 32, norm_first=False).eval()
    out = post(x)
    # post-LN：层的输出就是 LayerNorm 的输出（初始 γ=1, β=0）→ 每个位置均值 0、方差 1
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.var(-1, unbiased=False), torch.ones(2, 5), atol=1e-3, rtol=0)
    pre = EncoderLayer(16, 4, 32, norm_first=True).eval()
    out = pre(x)
    # pre-LN：残差主干不经过归一化，输入的偏移直接保留下来
    assert out.mean().item() == pytest.approx((x + 0).mean().item(), abs=0.5)
    assert out.var(-1).mean().item() > 2
    post_model = make_model(small_config())
    pre_model = make_model(small_config(norm_first=True))
    assert isinstance(post_model.encoder.norm, torch.nn.Identity)
    assert isinstance(pre_model.encoder.norm, torch.nn.LayerNorm)
    assert isinstance(pre_model.decoder.norm, torch.nn.LayerNorm)
    assert count_parameters(pre_model) == count_parameters(post_model) + 4 * 32


def closed_form_count(v_src, v_tgt, d, d_ff, n_enc, n_dec, tied_out=False, shared_emb=False):
    attn = 4 * (d * d + d)
    ffn = d * d_ff + d_ff + d_ff * d + d
    ln = 2 * d
    encoder = n_enc * (attn + ffn + 2 * ln)
    decoder = n_dec * (2 * attn + ffn + 3 * ln)
    embeddings = v_src * d + (0 if shared_emb else v_tgt * d)
    generator = (0 if tied_out else d * v_tgt) + v_tgt
    return encoder + decoder + embeddings + generator


def test_parameter_count_of_paper_base_model_matches_closed_form():
    config = TransformerConfig(37000, 37000, share_embeddings=True, tie_embeddings=True)
    model = make_model(config)
    expected = closed_form_count(37000, 37000, 512, 2048, 6, 6, tied_out=True, shared_emb=True)
    assert count_parameters(model) == expected
    assert 60e6 < expected < 66e6  # 论文表 3：base 模型约 65M 参数
    small = small_config()
    assert count_parameters(make_model(small)) == closed_form_count(30, 25, 32, 64, 2, 2)


def test_tied_embeddings_share_storage():
    model = make_model(small_config(src_vocab_size=25, share_embeddings=True, tie_embeddings=True))
    assert model.generator.proj.weight is model.tgt_embed.lut.weight
    assert model.tgt_embed.lut.weight is model.src_embed.lut.weight


@pytest.mark.parametrize(
    "overrides, error, pattern",
    [
        (dict(d_model=510, n_heads=8), ValueError, "d_model=510 不能被 n_heads=8 整除"),
        (dict(d_model=0), ValueError, "d_model 应是正整数，收到 0"),
        (dict(n_encoder_layers=-1), ValueError, "n_encoder_layers 应是正整数，收到 -1"),
        (dict(d_ff=2.5), TypeError, "d_ff 应是整数"),
        (dict(dropout=1.5), ValueError, "dropout 应是 \\[0, 1\\) 内的数"),
        (dict(positional="rotary"), ValueError, "positional 应是 .* 之一"),
        (dict(share_embeddings=True), ValueError, "share_embeddings=True 要求"),
    ],
)
def test_bad_config(overrides, error, pattern):
    with pytest.raises(error, match=pattern):
        small_config(**overrides)


def test_bad_model_inputs():
    model = make_model(small_config())
    src = torch.randint(4, 30, (2, 5))
    tgt = torch.randint(4, 25, (2, 4))
    with pytest.raises(ValueError, match=r"src 中的词元 id 落在 \[4, 31\]，超出了词表范围 \[0, 29\]"):
        model(torch.tensor([[4, 31]]), tgt[:1])
    with pytest.raises(ValueError, match=r"src 应是 2 维张量"):
        model(src[0], tgt)
    with pytest.raises(ValueError, match="src 是空序列"):
        model(src[:, :0], tgt)
    with pytest.raises(TypeError, match="src 应是整数类型的词元 id"):
        model(src.float(), tgt)
    with pytest.raises(ValueError, match="超出了位置编码的 max_len=40"):
        model(torch.randint(4, 30, (1, 41)), tgt[:1])
    with pytest.raises(TypeError, match="config 应是 TransformerConfig"):
        make_model({"d_model": 8})
