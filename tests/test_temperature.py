"""温度：0 表示贪心（API 与命令行），很小的正温度（1e-40）收敛到贪心而不是在 torch 里报 NaN。"""

import math

import pytest
import torch

from tformer_lib.commands.cli import main
from tformer_lib.translation.decoding import greedy_decode, sample_decode
from tformer_lib.lm import LMConfig, generate, make_lm, next_token_distribution
from tformer_lib.specials import BOS
from tformer_lib.temperature import apply_temperature, check_temperature, is_greedy_temperature


def _lm(seed=0):
    torch.manual_seed(seed)
    return make_lm(LMConfig(30, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=24)).eval()


@pytest.mark.parametrize("t", [0, 0.0, 1e-40, 1e-46, 1e-300, 5e-324])
def test_zero_and_tiny_temperatures_give_the_greedy_one_hot(t):
    logits = torch.randn(3, 11) * 50
    probs = apply_temperature(logits, t).softmax(-1)
    assert not probs.isnan().any()
    torch.testing.assert_close(probs, torch.nn.functional.one_hot(logits.argmax(-1), 11).float())


def test_tiny_temperature_is_the_limit_of_the_plain_formula():
    logits = torch.tensor([[2.0, 1.0, -3.0, 0.5]])
    for t in (1.0, 0.3):  # 不溢出时与 softmax(logits / T) 逐位相同
        assert torch.equal(apply_temperature(logits, t), logits / t)
    assert torch.isnan((logits / 1e-40).softmax(-1)).any()  # 直接相除：torch 给 NaN（问题的根源）
    torch.testing.assert_close(apply_temperature(logits, 1e-40).softmax(-1), torch.tensor([[1.0, 0, 0, 0]]))
    tie = torch.tensor([[1.0, 1.0, 0.0]])  # 并列第一：T → 0 的极限是两者平分
    torch.testing.assert_close(apply_temperature(tie, 1e-40).softmax(-1), torch.tensor([[0.5, 0.5, 0.0]]))
    assert torch.equal(apply_temperature(tie, 0).softmax(-1), torch.tensor([[1.0, 0.0, 0.0]]))  # 0 = argmax


@pytest.mark.parametrize("bad", [-1e-9, -1, math.inf, math.nan, True, "0.5"])
def test_bad_temperatures_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="temperature"):
        check_temperature("temperature", bad)
    with pytest.raises(ValueError, match="temperature"):
        next_token_distribution(torch.zeros(1, 5), temperature=bad)


def test_is_greedy_temperature_follows_the_dtype():
    assert is_greedy_temperature(0) and is_greedy_temperature(1e-46)
    assert not is_greedy_temperature(1e-40) and not is_greedy_temperature(1e-46, torch.float64)


@pytest.mark.parametrize("t", [0, 1e-40])
def test_lm_generate_with_zero_or_tiny_temperature_is_greedy(t):
    model = _lm(3)
    prompt = torch.tensor([[BOS, 4, 5], [BOS, 7, 8]])
    greedy = generate(model, prompt, 12, method="greedy")
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(generate(model, prompt, 12, temperature=t, generator=gen), greedy)
    if t == 0:  # 温度 0 直接走贪心：不消耗随机数
        assert torch.equal(gen.get_state(), torch.Generator().manual_seed(0).get_state())


def test_next_token_distribution_at_zero_temperature_is_one_hot_after_suppression():
    logits = torch.tensor([[9.0, 1.0, 3.0, 2.0]])
    p = next_token_distribution(logits, temperature=0, suppress_ids=(0,))
    assert torch.equal(p, torch.tensor([[0.0, 0.0, 1.0, 0.0]]))


@pytest.mark.parametrize("t", [0, 1e-40])
def test_translation_sampling_with_zero_or_tiny_temperature_is_greedy(t):
    from tformer_lib.translation.pretrained import load_or_train_toy_model, load_toy_data

    model, *_ = load_or_train_toy_model()
    src = torch.tensor([row for row, _ in load_toy_data()["test"][:8] if len(row) == 5][:4])
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(sample_decode(model, src, temperature=t, generator=gen), greedy_decode(model, src))


def test_cli_temperature_zero_means_greedy_and_negative_is_refused(capsys):
    assert main(["translate", "--method", "sample", "--temperature", "0", "人 咬 狗"]) == 0
    assert capsys.readouterr().out.strip() == "the person bites the dog"
    assert main(["translate", "--method", "sample", "--temperature", "1e-40", "狗 咬 人"]) == 0
    assert capsys.readouterr().out.strip() == "the dog bites the person"
    assert main(["translate", "--temperature", "-1", "狗"]) == 1
    assert "--temperature" in capsys.readouterr().err
    assert main(["lm-generate", "--temperature", "0", "--title", "春晓", "-n", "2"]) == 0
    first, second = capsys.readouterr().out.strip().split("\n\n")
    assert first == second  # 贪心：两首一样
