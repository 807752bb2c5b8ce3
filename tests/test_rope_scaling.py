"""RoPE 缩放（tformer_lib.parts.rope_scaling）：PI、NTK-aware、YaRN 的频率与公式逐项相符，与 transformers 的 ``linear``、
``yarn`` 相同；进了模型之后带缓存的生成不变，Hugging Face 目录来回读写的 logits 与 transformers 相同。"""

import math

import pytest
import torch

from tformer_lib import MultiHeadAttention
from tformer_lib.lm import LMConfig, UnsupportedHFConfig, load_hf, make_lm, save_hf
from tformer_lib.parts.positional import RopeTables, rope_angles
from tformer_lib.parts.rope_scaling import RopeScaling, rope_frequencies, scaled_rope_angles, yarn_attention_factor

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def _hf_frequencies(d, base, fields, max_len):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    heads = 2
    config = transformers.LlamaConfig(hidden_size=d * heads, num_attention_heads=heads, max_position_embeddings=max_len,
                                      rope_parameters={**fields, "rope_theta": base})
    return ROPE_INIT_FUNCTIONS[fields["rope_type"]](config, "cpu")


@pytest.mark.parametrize("d,base,factor,length,betas", [
    (16, 10000.0, 4.0, 64, (32.0, 1.0)), (64, 500000.0, 8.0, 4096, (32.0, 1.0)),
    (128, 1e6, 4.0, 32768, (32.0, 1.0)), (32, 10000.0, 2.0, 128, (16.0, 2.0)),
])
def test_linear_and_yarn_equal_transformers(d, base, factor, length, betas):
    theirs, attention = _hf_frequencies(d, base, {"rope_type": "linear", "factor": factor}, length)
    ours, ours_attention = rope_frequencies(d, base, RopeScaling("linear", factor))
    torch.testing.assert_close(ours.float(), theirs, rtol=1e-6, atol=0)
    assert ours_attention == attention == 1.0
    fields = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": length,
              "beta_fast": betas[0], "beta_slow": betas[1]}
    theirs, attention = _hf_frequencies(d, base, fields, int(length * factor))
    ours, ours_attention = rope_frequencies(d, base, RopeScaling("yarn", factor, length, *betas))
    torch.testing.assert_close(ours.float(), theirs, rtol=1e-6, atol=0)
    assert ours_attention == pytest.approx(attention) and attention == pytest.approx(0.1 * math.log(factor) + 1)


def test_each_formula_on_its_own_terms():
    d, base, s = 64, 10000.0, 4.0
    theta, _ = rope_frequencies(d, base)
    torch.testing.assert_close(theta, base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d))
    torch.testing.assert_close(rope_frequencies(d, base, RopeScaling("linear", s))[0], theta / s)
    ntk, _ = rope_frequencies(d, base, RopeScaling("ntk", s))
    assert ntk[0] == theta[0]  # 最高频不动
    torch.testing.assert_close(ntk[-1], theta[-1] / s)  # 最低频恰好除以 s
    assert bool(((ntk <= theta) & (ntk >= theta / s)).all())  # 中间在两者之间
    length = 2048
    yarn, attention = rope_frequencies(d, base, RopeScaling("yarn", s, length))
    rotations = length * theta / (2 * math.pi)  # 每对维度在训练长度里转的圈数
    fast, slow = rotations > 32 * 1.05, rotations < 1 / 1.05  # 离取整的边界远一点
    torch.testing.assert_close(yarn[fast], theta[fast])  # 转得多的：不动
    torch.testing.assert_close(yarn[slow], theta[slow] / s)  # 转得少的：位置插值
    assert fast.any() and slow.any()
    assert attention == yarn_attention_factor(s) == pytest.approx(0.1 * math.log(4) + 1)
    for kind in ("linear", "ntk"):  # s = 1：什么都不变
        torch.testing.assert_close(rope_frequencies(d, base, RopeScaling(kind, 1.0))[0], theta)
    yarn1, a1 = rope_frequencies(d, base, RopeScaling("yarn", 1.0, length))
    torch.testing.assert_close(yarn1, theta)
    assert a1 == 1.0


def test_position_interpolation_is_dividing_the_positions():
    positions = torch.arange(40)
    cos, sin = scaled_rope_angles(positions, 16, 10000.0, RopeScaling("linear", 4.0))
    ref_cos, ref_sin = rope_angles(positions / 4, 16, 10000.0)
    torch.testing.assert_close(cos, ref_cos)
    torch.testing.assert_close(sin, ref_sin)
    tables = RopeTables(positions, 16, 10000.0, RopeScaling("yarn", 2.0, 16))
    assert tables.scaling.kind == "yarn"
    cos, _ = tables._by_dtype[torch.float64]
    assert float(cos[0].max()) == pytest.approx(yarn_attention_factor(2.0))  # 位置 0：cos = 1 × 注意力系数


@pytest.mark.parametrize("scaling", [RopeScaling("linear", 2.0), RopeScaling("ntk", 4.0), RopeScaling("yarn", 4.0, 8)])
def test_scaled_lm_decodes_with_cache_like_the_full_forward(scaling):
    torch.manual_seed(0)
    model = make_lm(LMConfig(vocab_size=30, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=48, max_len=32,
                             positional="rope", norm="rms", rope_scaling=scaling)).eval()
    tokens = torch.randint(1, 30, (2, 20))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        parts = [model(tokens[:, :7], cache=cache)] + [model(tokens[:, t : t + 1], cache=cache) for t in range(7, 20)]
        plain = make_lm(LMConfig(**{**model.config.to_dict(), "rope_scaling": None}))
        plain.load_state_dict(model.state_dict())
        unscaled = plain.eval()(tokens)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    assert (full - unscaled).abs().max() > 1e-5  # 缩放确实改变了输出（忽略缩放时两者逐位相同）


def test_checkpoint_dict_round_trips_and_bad_settings_are_named():
    config = LMConfig(vocab_size=20, positional="rope", rope_scaling={"kind": "yarn", "factor": 4, "original_max_len": 64})
    assert LMConfig.from_dict(config.to_dict()) == config
    assert isinstance(config.rope_scaling, RopeScaling) and config.rope_scaling.factor == 4.0
    with pytest.raises(ValueError, match="只用于 positional='rope'"):
        LMConfig(vocab_size=20, rope_scaling=RopeScaling("linear", 2.0))
    with pytest.raises(ValueError, match="kind"):
        RopeScaling("dynamic", 2.0)
    with pytest.raises(ValueError, match="factor"):
        RopeScaling("linear", 0.5)
    with pytest.raises(ValueError, match="original_max_len"):
        RopeScaling("yarn", 2.0)
    with pytest.raises(ValueError, match="original_max_len 只用于"):
        RopeScaling("ntk", 2.0, 64)
    with pytest.raises(ValueError, match="beta_slow=40 应小于 beta_fast=32"):
        RopeScaling("yarn", 2.0, 64, beta_slow=40.0)
    with pytest.raises(ValueError, match="rope_scaling 的字典"):
        RopeScaling.from_dict({"type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="d ≥ 4"):
        rope_frequencies(2, 10000.0, RopeScaling("ntk", 2.0))
    attn = MultiHeadAttention(16, 2, rope=True, rope_scaling=RopeScaling("linear", 2.0))
    x = torch.randn(1, 5, 16)
    with pytest.raises(ValueError, match="缩放"):
        attn(x, x, x, positions=RopeTables(torch.arange(5), 8))
    with pytest.raises(TypeError, match="rope_scaling"):
        MultiHeadAttention(16, 2, rope=True, rope_scaling={"kind": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="rope=False"):
        MultiHeadAttention(16, 2, rope=False, rope_scaling=RopeScaling("linear", 2.0))
    with pytest.raises(ValueError, match="base"):  # 建配置时就报，而不是第一次前向
        LMConfig(vocab_size=20, positional="rope", rope_base=0.5, rope_scaling=RopeScaling("linear", 2.0))


def _hf_llama(tmp_path, rope_parameters):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False, rope_parameters=rope_parameters)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(tmp_path / "hf")
    return model


@pytest.mark.parametrize("rope_parameters", [
    {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 10000.0},
])
def test_hf_checkpoints_with_rope_scaling_load_and_save_with_identical_logits(tmp_path, rope_parameters):
    theirs = _hf_llama(tmp_path, rope_parameters)
    ours = load_hf(tmp_path / "hf").model
    assert ours.config.rope_scaling.kind == rope_parameters["rope_type"]
    tokens = torch.randint(0, 64, (2, 60))  # 远超 YaRN 的训练长度 16
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens).logits, rtol=1e-4, atol=1e-4)
        save_hf(ours, tmp_path / "ours")
        again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
        torch.testing.assert_close(again(tokens).logits, theirs(tokens).logits, rtol=1e-4, atol=1e-4)


def test_save_hf_refuses_static_ntk(tmp_path):
    model = make_lm(LMConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1, d_ff=16, max_len=16, positional="rope",
                             norm="rms", activation="swiglu", qkv_bias=False, out_bias=False, ffn_bias=False,
                             rope_scaling=RopeScaling("ntk", 2.0)))
    with pytest.raises(UnsupportedHFConfig, match="ntk"):
        save_hf(model, tmp_path / "m")


def test_yarn_training_length_is_taken_as_transformers_takes_it(tmp_path):
    """顶层的 original_max_position_embeddings（Phi-3 的写法）优先；都没有时是 max_position_embeddings。"""
    import json

    tokens = torch.randint(0, 64, (1, 60))
    for name, top, inner in (("top", 16, 32), ("missing", None, None)):
        fields = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
        if inner is not None:
            fields["original_max_position_embeddings"] = inner
        theirs = _hf_llama(tmp_path / name, fields)
        path = tmp_path / name / "hf"
        if top is not None:  # 写进 config.json 的顶层，再让 transformers 读回来当参照
            config = json.loads((path / "config.json").read_text())
            (path / "config.json").write_text(json.dumps({**config, "original_max_position_embeddings": top}))
            theirs = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
        ours = load_hf(path).model
        assert ours.config.rope_scaling.original_max_len == (top if top is not None else 64)
        with torch.no_grad():
            torch.testing.assert_close(ours(tokens), theirs(tokens).logits, rtol=1e-4, atol=1e-4)


def test_hf_scaling_values_we_cannot_express_are_named(tmp_path):
    import json

    _hf_llama(tmp_path, {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    path = tmp_path / "hf"
    config = json.loads((path / "config.json").read_text())
    for params, field in (({"rope_type": "linear", "factor": 0.5}, "factor"),
                          ({"rope_type": "yarn", "factor": 2.0, "beta_fast": 1.0, "beta_slow": 2.0}, "beta_slow")):
        (path / "config.json").write_text(json.dumps({**config, "rope_parameters": {**params, "rope_theta": 1e4}}))
        with pytest.raises(UnsupportedHFConfig, match=field):
            load_hf(path)
