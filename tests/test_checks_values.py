"""读取取值的检查（词元 id、位置越界）的开关 ``_checks.CHECK_VALUES``：默认只在 CPU 上做，可强制打开或关闭。"""

import importlib

import pytest
import torch

import tformer_lib._checks as checks
from tformer_lib.lm import LMConfig, make_lm


@pytest.fixture
def switch(monkeypatch):
    """测试里改开关；结束后 monkeypatch 把它恢复成 conftest 设的 True。"""
    def set_to(value):
        monkeypatch.setattr(checks, "CHECK_VALUES", value)
    return set_to


def test_default_scans_cpu_tensors_only(switch):
    switch(None)
    with pytest.raises(ValueError, match="超出了词表范围"):
        checks.token_ids("tokens", torch.tensor([[0, 9]]), vocab_size=5)
    # meta 张量没有取值：读它会出错；默认设置下不去读，只查 dtype
    meta = torch.empty(2, 3, dtype=torch.long, device="meta")
    assert checks.token_ids("tokens", meta, vocab_size=5) is meta
    assert checks.check_values(torch.zeros(1)) and not checks.check_values(meta)


def test_off_skips_the_scan_but_not_the_type_checks(switch):
    switch(False)
    bad = torch.tensor([[0, 9]])
    assert checks.token_ids("tokens", bad, vocab_size=5) is bad  # 不扫描取值
    with pytest.raises(TypeError, match="整数类型"):
        checks.token_ids("tokens", bad.float(), vocab_size=5)  # dtype 不花时间，照查
    with pytest.raises(TypeError, match="torch.Tensor"):
        checks.token_ids("tokens", [[0, 9]], vocab_size=5)


def test_on_scans_every_device(switch):
    switch(True)
    meta = torch.empty(2, 3, dtype=torch.long, device="meta")
    with pytest.raises((NotImplementedError, RuntimeError)):  # 真的去读了 meta 张量的取值
        checks.token_ids("tokens", meta, vocab_size=5)


def test_model_forward_follows_the_switch(switch):
    model = make_lm(LMConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=8))
    bad_positions = torch.tensor([0, 9])  # 超出 max_len=8
    switch(True)
    with pytest.raises(ValueError, match="超出上下文长度"):
        model(torch.tensor([[1, 2]]), positions=bad_positions)
    switch(False)  # 不扫描：越界的位置直到查表时才出错（PyTorch 自己的 IndexError，不点名参数）
    with pytest.raises(IndexError):
        model(torch.tensor([[1, 2]]), positions=bad_positions)


@pytest.mark.parametrize("env, expected", [("1", True), ("0", False), ("", None)])
def test_environment_variable_sets_the_switch_at_import(monkeypatch, env, expected):
    monkeypatch.setenv("TFORMER_CHECK_VALUES", env)
    try:
        assert importlib.reload(checks).CHECK_VALUES is expected
    finally:
        monkeypatch.delenv("TFORMER_CHECK_VALUES")
        importlib.reload(checks)
        checks.CHECK_VALUES = True  # conftest 的设置


def test_finite_real_bounds_and_messages():
    assert checks.finite_real("x", 1, at_least=1) == 1.0 and checks.finite_real("x", 0.5, above=0) == 0.5
    with pytest.raises(ValueError, match=r"x 应是 > 0 的有限数，收到 0"):
        checks.finite_real("x", 0, above=0)
    # 界的短写法会失真时写全：0.1 + 0.2 不写成 0.3
    with pytest.raises(ValueError, match=r"> 0\.30000000000000004 的有限数，收到 0\.3$"):
        checks.finite_real("x", 0.3, above=0.1 + 0.2)
    with pytest.raises(ValueError, match="x 应是有限的数"):  # 大到转不成 float 的整数：ValueError，不是 OverflowError
        checks.finite_real("x", 10**400)
    with pytest.raises(ValueError, match="界应是有限的数"):  # NaN 的界会让任何数都“通过”
        checks.finite_real("x", -5, above=float("nan"))
    with pytest.raises(TypeError, match="至多给一个"):
        checks.finite_real("x", 0.5, above=0, at_least=1)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.uint16, torch.uint32])
def test_token_ids_accept_only_the_dtypes_an_embedding_can_index_with(dtype):
    with pytest.raises(TypeError, match=r"tokens 应是整数类型的词元 id（torch.long 或 torch.int32）"):
        checks.token_ids("tokens", torch.tensor([[1, 2]]).to(dtype), vocab_size=5)
    assert checks.token_ids("tokens", torch.tensor([[1, 2]], dtype=torch.int32), vocab_size=5).dtype == torch.int32


def test_model_forward_names_positions_dtype_and_device():
    model = make_lm(LMConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=8))
    ok = torch.tensor([[1, 2, 3]])
    with pytest.raises(TypeError, match="positions 应是 torch.long 或 torch.int32 的整数张量，收到 dtype torch.int16"):
        model(ok, positions=torch.arange(3, dtype=torch.int16))
    with pytest.raises(TypeError, match=r"positions 应是整数张量 \(T,\) 或 \(B, T\)，收到 list"):
        model(ok, positions=[0, 1, 2])
    with pytest.raises(ValueError, match="tokens 在 meta 上，模型的参数在 cpu 上"):  # 不会悄悄算出未初始化的内存
        model(ok.to("meta"))


def test_helpers_check_their_own_parameters():
    with pytest.raises(ValueError, match="vocab_size 应是正整数（tokens 的词表大小），收到 0"):
        checks.token_ids("tokens", torch.tensor([[0]]), vocab_size=0)
    with pytest.raises(ValueError, match="vocab_size 应是正整数"):
        checks.token_ids("tokens", torch.tensor([[0]]), vocab_size=10.5)
    with pytest.raises(TypeError, match="minimum 应是整数"):
        checks.positive_int("n", 3, minimum=None)
    assert checks.positive_int("n", 3, minimum=3) == 3


def test_language_model_names_what_is_missing():
    class HalfConfig:
        vocab_size = 10

    class Half(torch.nn.Module):
        config = HalfConfig()

    with pytest.raises(TypeError, match="收到的 Half 的 .config 缺少 max_len"):
        checks.language_model("model", Half())
    with pytest.raises(TypeError, match="收到的 Linear 没有 .config"):
        checks.language_model("model", torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="收到 str"):
        checks.language_model("model", "gpt2")
