"""语言模型的生成：缓存与不缓存逐词相同（每种选项组合）、提示不出现在结果里、种子可复现、
top-k / top-p 的定义、PAD/BOS 不会被生成、上下文长度与坏参数的错误。"""

import itertools

import pytest
import torch

from tformer_lib import BOS, EOS, PAD
from tformer_lib.lm import LMConfig, make_lm
from tformer_lib.lm.generate import filter_top_k, filter_top_p, generate, greedy_tokens, next_token_distribution

V = 30


def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    base = dict(vocab_size=V, d_model=16, n_heads=4, n_layers=2, d_ff=32, max_len=20)
    base.update(kw)
    return make_lm(LMConfig(**base)).eval()


OPTIONS = list(itertools.product(("learned", "sinusoidal", "rope", "none"), ("layer", "rms"), (True, False),
                                 ("relu", "gelu", "swiglu"), (None, 2, 1)))


@pytest.mark.parametrize("positional, norm, norm_first, activation, n_kv_heads", OPTIONS)
def test_cached_generation_equals_uncached(positional, norm, norm_first, activation, n_kv_heads):
    model = tiny(positional=positional, norm=norm, norm_first=norm_first, activation=activation,
                 n_kv_heads=n_kv_heads)
    # 未训练的小模型分布很平，放大 logits 让贪心与采样都有明确的选择
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    prompt = torch.randint(4, V, (3, 4))
    for kw in (dict(method="greedy"), dict(temperature=0.9, top_k=8), dict(top_p=0.8)):
        cached = generate(model, prompt, 12, generator=torch.Generator().manual_seed(1), **kw)
        plain = generate(model, prompt, 12, generator=torch.Generator().manual_seed(1), use_cache=False, **kw)
        assert torch.equal(cached, plain), kw


def test_prompt_not_returned_and_shapes():
    model = tiny()
    out = generate(model, [BOS, 5, 6], 7, method="greedy")
    assert out.shape == (7,)
    batch = generate(model, torch.tensor([[BOS, 5, 6], [BOS, 7, 8]]), 4, method="greedy")
    assert batch.shape == (2, 4)
    assert torch.equal(batch[0], out[:4])  # 批中每行与单独生成相同
    assert generate(model, [BOS], method="greedy").shape == (19,)  # 默认填满上下文


def test_seeded_sampling_is_reproducible_and_varies_with_seed():
    model = tiny()
    run = lambda s: generate(model, [BOS], 15, generator=torch.Generator().manual_seed(s))  # noqa: E731
    assert torch.equal(run(3), run(3))
    assert not all(torch.equal(run(3), run(s)) for s in range(4, 8))


class Boosted(torch.nn.Module):
    """包一层：给某些行、某些词元的 logits 加一个大数（不改模型本身）。"""

    def __init__(self, model, token_ids, rows=slice(None), bonus=100.0):
        super().__init__()
        self.model, self.config = model, model.config
        self.token_ids, self.rows, self.bonus = list(token_ids), rows, bonus

    def new_cache(self):
        return self.model.new_cache()

    def forward(self, tokens, **kw):
        logits = self.model(tokens, **kw).clone()
        logits[self.rows, :, self.token_ids] += self.bonus
        return logits


def test_pad_and_bos_never_generated():
    model = Boosted(tiny(), [PAD, BOS])
    out = generate(model, torch.full((4, 2), BOS), 15, generator=torch.Generator().manual_seed(0), temperature=2.0)
    assert not ((out == PAD) | (out == BOS)).any()
    assert not ((generate(model, [BOS], 5, method="greedy") == PAD)).any()


def test_eos_stops_and_pads():
    model = Boosted(tiny(), [EOS], rows=0)  # 第 0 行立刻生成 EOS
    out = generate(model, torch.tensor([[BOS, 5], [BOS, 6]]), 10, method="greedy", eos_id=EOS)
    assert out[0].tolist() == [EOS] + [PAD] * (out.shape[1] - 1)
    assert out.shape[1] == 10 or EOS in out[1].tolist()
    both = Boosted(tiny(), [EOS])  # 所有行都结束了就提前停
    assert generate(both, torch.tensor([[BOS], [BOS]]), 10, method="greedy", eos_id=EOS).shape == (2, 1)


def test_top_k_and_top_p_filters():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0]])
    assert torch.isinf(filter_top_k(logits, 2)).tolist() == [[False, True, False, True]]
    tied = torch.tensor([[3.0, 2.0, 2.0, 0.0]])  # 第 2 名并列：两个都留下（文档写明的约定）
    assert torch.isinf(filter_top_k(tied, 2)).tolist() == [[False, False, False, True]]
    probs = logits.softmax(-1)[0]  # ≈ 0.64, 0.09, 0.24, 0.03
    kept = ~torch.isinf(filter_top_p(logits, 0.7))
    assert kept.tolist() == [[True, False, True, False]]  # 0.64 不够 0.7，再加 0.24
    assert (~torch.isinf(filter_top_p(logits, 0.5))).tolist() == [[True, False, False, False]]
    assert float(probs[0]) > 0.5
    p = next_token_distribution(logits, temperature=1.0, top_k=None, top_p=None, suppress_ids=())
    torch.testing.assert_close(p, logits.softmax(-1))
    assert torch.equal(next_token_distribution(logits, top_k=1, suppress_ids=()).argmax(-1), torch.tensor([0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_tokens_pick_the_largest_unbanned_logit(dtype):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(64, 50, generator=g) * 4).to(dtype)  # (B, V)
    logits[:, PAD] = logits[:, BOS] = 100.0  # 最大的两个被屏蔽
    picked = greedy_tokens(logits)
    assert torch.equal(picked, next_token_distribution(logits, 1.0, None, None).argmax(dim=-1))
    assert not ((picked == PAD) | (picked == BOS)).any()
    # 并列时取 id 最小的（与 argmax 相同）；屏蔽 () 时 PAD 也能被选中
    tied = torch.zeros(2, 6, dtype=dtype)
    tied[:, [2, 4]] = 1.0
    assert greedy_tokens(tied).tolist() == [2, 2] and greedy_tokens(torch.ones(1, 6), ()).tolist() == [0]


def test_greedy_tokens_refuse_rows_with_no_finite_choice():
    for row in (torch.tensor([[0.0, 0.0, 1.0, float("nan")]]), torch.tensor([[0.0, 0.0, 1.0, float("inf")]]),
                torch.tensor([[5.0, 5.0, float("-inf")]])):  # NaN；+inf；屏蔽 PAD、BOS 之后只剩 −inf
        with pytest.raises(ValueError, match="没有一个有限值"):
            greedy_tokens(row)


def test_greedy_and_sampling_name_bad_logits_and_suppress_ids():
    logits = torch.randn(2, 6)
    for bad in ([[0.0, 1.0]], torch.ones(2, 6, dtype=torch.long), torch.ones(2, 0), torch.tensor(3.0)):
        with pytest.raises(ValueError, match="logits 应是"):
            greedy_tokens(bad)
    for ids, err in ((("1",), TypeError), ((True,), TypeError), ((99,), ValueError), ((-1,), ValueError), (None, TypeError)):
        with pytest.raises(err, match="suppress_ids"):
            greedy_tokens(logits, ids)
        with pytest.raises(err, match="suppress_ids"):
            next_token_distribution(logits, 1.0, None, None, ids)
    for row in (torch.tensor([[0.0, 0.0, 1.0, float("nan")]]), torch.tensor([[0.0, 0.0, 1.0, float("inf")]])):
        with pytest.raises(ValueError, match="没有一个有限值"):  # 采样也不让 NaN/+inf 变成一行 NaN 的分布
            next_token_distribution(row, 1.0, None, None)
    model = make_lm(LMConfig(12, d_model=16, n_heads=2, n_layers=1, d_ff=16, max_len=16))
    with pytest.raises(ValueError, match="suppress_ids"):
        generate(model, [1, 5], 3, method="greedy", suppress_ids=(0, 12))


def test_low_temperature_approaches_greedy():
    model = tiny(seed=2)
    greedy = generate(model, [BOS, 4], 10, method="greedy")
    cold = generate(model, [BOS, 4], 10, temperature=1e-4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(greedy, cold)


@pytest.mark.parametrize(
    "kw, exc, word",
    [
        (dict(prompt=list(range(21))), ValueError, "max_len=20"),
        (dict(prompt=[BOS] * 10, max_new_tokens=11), ValueError, "max_new_tokens=11"),
        (dict(prompt=[]), ValueError, "prompt"),
        (dict(prompt="床前"), TypeError, "prompt"),
        (dict(prompt=[BOS], temperature=-0.1), ValueError, "temperature"),
        (dict(prompt=[BOS], temperature=float("inf")), ValueError, "temperature"),
        (dict(prompt=[BOS], top_k=True), ValueError, "top_k"),
        (dict(prompt=[BOS], top_p=1.5), ValueError, "top_p"),
        (dict(prompt=[BOS], method="beam"), ValueError, "method"),
        (dict(prompt=[BOS], max_new_tokens=-1), ValueError, "max_new_tokens"),
    ],
)
def test_bad_arguments(kw, exc, word):
    with pytest.raises(exc, match=word):
        generate(tiny(), **kw)
