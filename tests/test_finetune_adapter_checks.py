"""适配器与 LoRA 的每一种错误输入：报错指名哪一项，并且**在改动模型之前**就报——失败后模型原样，可以重试；
QLoRA 的适配器只装在同一格式的量化底座上（装在浮点底座上算的是另一个函数）。"""

import copy

import numpy as np
import pytest
import torch

from tformer_lib.finetune import apply_lora, merge_lora, trainable_parameters
from tformer_lib.finetune.adapter_file import (adapter_from_model, apply_adapter, check_adapter_fits, load_adapter,
                                               quantize_base_for, save_adapter)
from tformer_lib.finetune.lora import LoRALinear, find_targets
from tformer_lib.finetune.memory import finetune_memory, lora_activation_bytes, lora_parameter_count
from tformer_lib.finetune.multi_lora import AdapterSet, MultiLoRALinear
from tformer_lib.finetune.qlora import apply_qlora
from tformer_lib.lm import LMConfig, generate, make_lm
from tformer_lib.quant import Int4Linear, dequantize_model, quantize_model
from tformer_lib.serving import Engine, Request
from tformer_lib.commands.serve import parse_adapters
from tformer_lib.training.checkpoint import CheckpointError

CONFIG = dict(vocab_size=40, d_model=64, n_heads=4, n_layers=2, d_ff=128, max_len=32, positional="rope",
              norm="rms", activation="swiglu", norm_first=True, tie_embeddings=True, fast_attention=True)


def _base():
    torch.manual_seed(0)
    return make_lm(LMConfig(**CONFIG)).eval()


def _adapter(base, targets=("w_q", "w_v"), rank=4, qlora=False, seed=1):
    torch.manual_seed(seed)
    model = copy.deepcopy(base)
    model = apply_qlora(model, rank, 2 * rank, targets=targets) if qlora else apply_lora(model, rank, 2 * rank, targets=targets)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(0, 1.0)
    return model, adapter_from_model(model)


def _snapshot(model):
    return {k: (type(m).__name__, ) for k, m in model.named_modules()}, {k: v.clone() for k, v in model.state_dict().items()}


def _unchanged(model, snapshot):
    modules, state = snapshot
    now = model.state_dict()
    return ({k: (type(m).__name__, ) for k, m in model.named_modules()} == modules and set(now) == set(state)
            and all(torch.equal(now[k], v) for k, v in state.items()))


@pytest.mark.parametrize("make", [lambda: iter(["w_q"]), lambda: (t for t in ["w_q"]), lambda: map(str, ["w_q"]),
                                  lambda: "w_q", lambda: [], lambda: {"w_q"}])
def test_targets_that_are_not_a_list_or_tuple_are_refused_before_anything_changes(make):
    base = _base()
    snap = _snapshot(base)
    for call in (lambda m: apply_lora(m, 4, 8, targets=make()), lambda m: apply_qlora(m, 4, 8, targets=make()),
                 lambda m: find_targets(m, make()), lambda m: lora_parameter_count(m.config, 4, make())):
        with pytest.raises(TypeError, match="targets"):
            call(base)
        assert _unchanged(base, snap)


def test_apply_qlora_on_a_model_that_already_has_lora_leaves_it_unquantized():
    model = apply_lora(_base(), 2, 4, targets=("w_q",))
    with pytest.raises(ValueError, match="已经加过 LoRA"):
        apply_qlora(model, 2, 4, targets=("w_k",))
    assert not any(isinstance(m, Int4Linear) for m in model.modules())


def _broken(adapter, how):
    bad = copy.deepcopy(adapter)
    key = sorted(bad["state"])[0]
    if how == "extra target":
        bad["targets"] = [*bad["targets"], "w_k"]
    elif how == "missing tensor":
        del bad["state"][key]
    elif how == "wrong shape":
        bad["state"][key] = torch.zeros(2, 5)
    elif how == "zero rank":
        bad["rank"] = 0
    elif how == "string rank":
        bad["rank"] = "2"
    elif how == "unknown layer":
        bad["state"]["blocks.9.self_attn.w_q.lora_A"] = torch.zeros(4, 64)
    elif how == "no base_config":
        del bad["base_config"]
    return bad


HOW = ["extra target", "missing tensor", "wrong shape", "zero rank", "string rank", "unknown layer", "no base_config"]


@pytest.mark.parametrize("how", HOW)
def test_a_bad_adapter_is_refused_with_its_problem_named_and_the_model_untouched(how):
    base = _base()
    _, good = _adapter(base)
    bad = _broken(good, how)
    for install in (lambda m: apply_adapter(m, bad), lambda m: AdapterSet(m, {"good": good, "bad": bad})):
        model = copy.deepcopy(base)
        snap = _snapshot(model)
        with pytest.raises((ValueError, TypeError, CheckpointError)) as caught:
            install(model)
        assert not isinstance(caught.value, (KeyError, ZeroDivisionError))
        assert _unchanged(model, snap), how
    # 失败之后照样能装上正确的适配器
    fixed = apply_adapter(copy.deepcopy(base), good)
    assert sum(isinstance(m, LoRALinear) for m in fixed.modules()) == 4


def test_adapter_set_names_the_adapter_whose_tensor_has_the_wrong_shape():
    base = _base()
    _, good = _adapter(base)
    with pytest.raises(CheckpointError, match="'bad'.*形状"):
        AdapterSet(copy.deepcopy(base), {"good": good, "bad": _broken(good, "wrong shape")})


def test_extra_that_weights_only_cannot_read_back_is_refused_when_saving(tmp_path):
    model, _ = _adapter(_base())
    for extra, bad_key in (({"ppl": np.float64(3.2)}, "ppl"), ({"ok": 1, "where": tmp_path}, "where")):
        with pytest.raises(TypeError, match=f"extra\\[{bad_key!r}\\]"):
            save_adapter(tmp_path / "a.pt", model, extra=extra)
        assert not (tmp_path / "a.pt").exists()
    for extra in ([1, 2], "abc"):
        with pytest.raises(TypeError, match="extra 应是字典"):
            save_adapter(tmp_path / "a.pt", model, extra=extra)
    save_adapter(tmp_path / "a.pt", model, extra={"ppl": 3.2, "where": str(tmp_path), "t": torch.ones(2)})
    assert load_adapter(tmp_path / "a.pt")["extra"]["ppl"] == 3.2


def test_load_adapter_rejects_a_directory_and_a_file_with_a_zero_rank(tmp_path):
    with pytest.raises(IsADirectoryError, match="是目录"):
        load_adapter(tmp_path)
    model, adapter = _adapter(_base())
    adapter["rank"] = 0
    torch.save(adapter, tmp_path / "zero.pt")
    with pytest.raises(CheckpointError, match="rank"):
        load_adapter(tmp_path / "zero.pt")


def test_a_qlora_adapter_is_refused_on_a_float_base_and_fits_once_the_base_is_quantized():
    base = _base()
    trained, adapter = _adapter(base, targets=("w_q", "w_v", "w_1"), qlora=True)
    assert adapter["base_format"] == "int4-g64"
    float_base = copy.deepcopy(base)
    snap = _snapshot(float_base)
    with pytest.raises(ValueError, match="int4-g64 的底座.*quantize_base_for"):
        apply_adapter(float_base, adapter)
    with pytest.raises(ValueError, match="int4-g64"):
        AdapterSet(float_base, {"q": adapter})
    assert _unchanged(float_base, snap)
    with pytest.raises(ValueError, match="从浮点的底座开始"):  # 反过来：浮点底座的适配器不装在 int4 底座上
        apply_adapter(quantize_model(copy.deepcopy(base), "int4-g64"), _adapter(base)[1])
    tokens = torch.randint(3, 40, (2, 12))
    rebuilt = apply_adapter(quantize_base_for(copy.deepcopy(base), [adapter]), adapter)
    served = AdapterSet(quantize_base_for(copy.deepcopy(base), [adapter]), {"q": adapter})
    merged = dequantize_model(merge_lora(copy.deepcopy(trained)))
    with torch.no_grad():
        want = trained(tokens)
        assert torch.equal(rebuilt(tokens), want)
        with served.route(torch.zeros_like(tokens)):
            torch.testing.assert_close(served.model(tokens), want, atol=1e-5, rtol=0)
        torch.testing.assert_close(merged(tokens), want, atol=1e-5, rtol=0)
    assert not any(isinstance(m, Int4Linear) for m in merged.modules())  # 整个模型回到浮点


def test_quantize_base_for_refuses_adapters_trained_on_different_formats():
    base = _base()
    _, q = _adapter(base, qlora=True)
    _, f = _adapter(base)
    with pytest.raises(ValueError, match="底座格式不同"):
        quantize_base_for(copy.deepcopy(base), [q, f])
    assert not any(isinstance(m, Int4Linear) for m in quantize_base_for(copy.deepcopy(base), [f]).modules())


def test_merge_lora_on_qlora_keeps_untargeted_layers_quantized_and_dequantize_model_finishes_the_job():
    model = apply_qlora(_base(), 4, 8, targets=("w_q", "w_v", "w_1"))
    merged = merge_lora(model)
    assert sum(isinstance(m, Int4Linear) for m in merged.modules()) == 8  # w_k、w_o、w_2、w_3（SwiGLU）× 2 层
    assert not any(isinstance(m, Int4Linear) for m in dequantize_model(merged).modules())


def test_adapter_set_replaces_every_path_to_a_shared_layer():
    base = _base()
    base.blocks[1].self_attn.w_q = base.blocks[0].self_attn.w_q  # 一个层，两条路径
    trained, adapter = _adapter(base, targets=("w_q",))
    served = AdapterSet(copy.deepcopy(base), {"a": adapter})
    assert isinstance(served.model.blocks[1].self_attn.w_q, MultiLoRALinear)
    assert served.model.blocks[1].self_attn.w_q is served.model.blocks[0].self_attn.w_q
    tokens = torch.randint(3, 40, (2, 10))
    with torch.no_grad(), served.route(torch.zeros_like(tokens)):
        torch.testing.assert_close(served.model(tokens), trained(tokens), atol=1e-5, rtol=0)


def test_multi_lora_linear_refuses_a_non_linear_base_and_the_base_only_index():
    base = _base()
    served = AdapterSet(copy.deepcopy(base), {"a": _adapter(base)[1]})
    with pytest.raises(TypeError, match="base 应是 nn.Linear"):
        MultiLoRALinear(torch.nn.Embedding(4, 4), served)
    layer = served.model.blocks[0].self_attn.w_q
    for index in (-1, 0, True):
        with pytest.raises(ValueError, match="index|已经加过"):
            layer.add(index, torch.zeros(2, 64), torch.zeros(64, 2), 1.0)


def test_engine_run_with_one_bad_request_queues_none_of_them():
    base = _base()
    served = AdapterSet(base, {"a": _adapter(base)[1]})
    engine = Engine(base, adapters=served)
    with pytest.raises(ValueError, match="zzz"):
        engine.run([Request([3, 4, 5], 2), Request([3, 4], 2, adapter="zzz")])
    assert len(engine.waiting) == 0
    good = Request([3, 4, 5], 2, adapter="a")
    engine.run([good])
    assert good.done and len(good.output) == 2


def test_engine_says_when_the_adapter_set_belongs_to_another_model():
    base = _base()
    served = AdapterSet(copy.deepcopy(base), {"a": _adapter(base)[1]})
    with pytest.raises(ValueError, match="另一个模型"):
        Engine(base, adapters=served)


def test_parse_adapters_refuses_a_bare_string_and_names_with_spaces():
    with pytest.raises(TypeError, match="列表"):
        parse_adapters("a=b.pt")
    with pytest.raises(ValueError, match="空白"):
        parse_adapters([" a =x.pt"])
    assert parse_adapters(["a=x.pt", "b=y=z.pt"]) == {"a": "x.pt", "b": "y=z.pt"}


def test_memory_functions_name_the_argument_they_reject():
    config = LMConfig(**CONFIG)
    with pytest.raises(TypeError, match="config 应是 LMConfig"):
        finetune_memory({"d_model": 64}, "lora", batch=1, length=8)
    with pytest.raises(TypeError, match="config 应是 LMConfig"):
        lora_parameter_count({"d_model": 64}, 4)
    with pytest.raises(ValueError, match="activation_bytes"):
        finetune_memory(config, "lora", batch=1, length=8, activation_bytes=0)
    with pytest.raises(ValueError, match="max_len=32"):
        lora_activation_bytes(config, 1, 33)
    assert trainable_parameters(apply_lora(_base(), 4, 8, targets=["w_q"])) == lora_parameter_count(config, 4, ["w_q"])
