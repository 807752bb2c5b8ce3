"""适配器文件与多适配器服务：存读往返、拒绝装错底座；一批里混着两个适配器与底座的请求，
每个都与各自合并后的模型单独贪心生成逐词元相同。"""

import copy

import pytest
import torch

from tformer_lib.finetune import apply_lora, merge_lora
from tformer_lib.finetune.adapter_file import adapter_from_model, apply_adapter, load_adapter, save_adapter
from tformer_lib.finetune.multi_lora import AdapterSet, MultiLoRALinear
from tformer_lib.finetune.qlora import apply_qlora
from tformer_lib.lm import LMConfig, generate, make_lm
from tformer_lib.serving import Engine, Request
from tformer_lib.training.checkpoint import CheckpointError


def _base(**kw):
    torch.manual_seed(0)
    config = dict(vocab_size=40, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=48, positional="rope",
                  norm="rms", activation="swiglu", norm_first=True, tie_embeddings=True, fast_attention=True)
    return make_lm(LMConfig(**{**config, **kw})).eval()


def _trained_adapter(base, seed, rank, targets):
    """一个 B ≠ 0 的适配器（随机的 B 足够让生成的词元与底座不同）。"""
    torch.manual_seed(seed)
    model = apply_lora(copy.deepcopy(base), rank, 2 * rank, targets=targets)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(0, 2.0)
    return model


def _greedy(model, prompt, n):
    return generate(model, prompt, n, method="greedy").tolist()


def test_adapter_file_round_trips_and_refuses_the_wrong_base(tmp_path):
    base = _base()
    trained = _trained_adapter(base, 1, 4, ("w_q", "w_v", "w_2"))
    path = save_adapter(tmp_path / "a.pt", trained, extra={"author": "杜甫"})
    adapter = load_adapter(path)
    assert adapter["rank"] == 4 and adapter["alpha"] == 8 and adapter["targets"] == ["w_2", "w_q", "w_v"]
    assert adapter["base_format"] == "fp32" and adapter["extra"] == {"author": "杜甫"}
    rebuilt = apply_adapter(copy.deepcopy(base), adapter)
    tokens = torch.randint(3, 40, (2, 12))
    with torch.no_grad():
        assert torch.equal(rebuilt(tokens), trained(tokens))
    assert path.stat().st_size < 0.2 * sum(p.numel() * 4 for p in base.parameters())  # 只存支路
    with pytest.raises(ValueError, match="d_model"):
        apply_adapter(_base(d_model=48), adapter)
    with pytest.raises(ValueError, match="没有 LoRALinear"):
        adapter_from_model(base)
    (tmp_path / "junk.pt").write_bytes(b"not a file")
    with pytest.raises(CheckpointError, match="无法读取"):
        load_adapter(tmp_path / "junk.pt")
    torch.save({"format": "tformer-checkpoint"}, tmp_path / "ckpt.pt")
    with pytest.raises(CheckpointError, match="不是 LoRA 适配器"):
        load_adapter(tmp_path / "ckpt.pt")
    with pytest.raises(FileNotFoundError):
        load_adapter(tmp_path / "missing.pt")
    q = apply_qlora(copy.deepcopy(base), 2, 4, targets=("w_q",), fmt="int4-g32")
    assert adapter_from_model(q)["base_format"] == "int4-g32"


def test_a_routed_forward_equals_each_merged_model():
    base = _base()
    one = _trained_adapter(base, 1, 4, ("w_q", "w_v"))
    two = _trained_adapter(base, 2, 8, ("w_k", "w_o", "w_1", "w_2", "w_3"))
    served = copy.deepcopy(base)
    adapters = AdapterSet(served, {"one": adapter_from_model(one), "two": adapter_from_model(two)})
    assert sum(isinstance(m, MultiLoRALinear) for m in served.modules()) == 2 * 7
    merged = [base, merge_lora(copy.deepcopy(one)), merge_lora(copy.deepcopy(two))]
    tokens = torch.randint(3, 40, (3, 10))
    ids = torch.tensor([-1, 0, 1])[:, None].expand(3, 10)
    with torch.no_grad(), adapters.route(ids):
        logits = served(tokens)
    with torch.no_grad():
        for row, model in enumerate(merged):
            assert float((logits[row] - model(tokens[row : row + 1])[0]).abs().max()) < 1e-4
        assert torch.equal(served(tokens), base(tokens))  # route 之外就是底座
    with pytest.raises(ValueError, match="形状"):
        with torch.no_grad(), adapters.route(torch.zeros(3, 9, dtype=torch.long)):
            served(tokens)
    with pytest.raises(ValueError, match="取值"):
        with adapters.route(torch.full((3, 10), 2)):
            pass
    with pytest.raises(ValueError, match="three"):
        adapters.index("three")
    with pytest.raises(ValueError, match="已经加过"):
        AdapterSet(served, {"one": adapter_from_model(one)})
    with pytest.raises(ValueError, match="配置不同"):
        AdapterSet(_base(n_layers=3), {"one": adapter_from_model(one)})


def test_engine_serves_two_adapters_and_the_base_in_one_batch_token_identically():
    base = _base(tie_embeddings=False)  # 共享嵌入的随机小模型只会重复上一个词元，看不出适配器的差别
    models = {"one": _trained_adapter(base, 1, 4, ("w_q", "w_v")), "two": _trained_adapter(base, 2, 8, ("w_v", "w_2"))}
    merged = {None: base, **{k: merge_lora(copy.deepcopy(m)) for k, m in models.items()}}
    served = copy.deepcopy(base)
    adapters = AdapterSet(served, {k: adapter_from_model(m) for k, m in models.items()})
    engine = Engine(served, max_batch=4, block_size=4, adapters=adapters)
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(3, 40, (9,), generator=g).tolist()  # 同一个提示前缀：不同适配器之间不能共用 K/V
    names = [None, "one", "two"]
    requests = [Request(shared + [5], 8, adapter=name) for name in names]  # 同一个提示、三个模型
    for i in range(6):
        suffix = torch.randint(3, 40, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist()
        requests.append(Request(shared + suffix, 8, adapter=names[i % 3]))
    engine.run(requests)
    for r in requests:
        assert r.output == _greedy(merged[r.adapter], r.prompt, 8), r.adapter
    assert len({tuple(r.output) for r in requests[:3]}) == 3  # 三个模型确实给出不同的续写（前缀块没有跨适配器共用）
    assert engine.prefill_tokens_saved > 0  # 同一适配器的请求之间仍共用前缀
    steps_with = {}
    for r in requests:
        for step, _ in r.slot_steps:
            steps_with.setdefault(step, set()).add(r.adapter)
    assert any(len(v) == 3 for v in steps_with.values())  # 有的步里三种请求在同一次前向
    with pytest.raises(ValueError, match="没有装适配器"):
        Engine(copy.deepcopy(base)).add_request([3, 4], 2, adapter="one")
    with pytest.raises(ValueError, match="可选"):
        engine.add_request([3, 4], 2, adapter="three")
    with pytest.raises(ValueError, match="另一个模型"):
        Engine(copy.deepcopy(base), adapters=adapters)
    with pytest.raises(TypeError, match="AdapterSet"):
        Engine(copy.deepcopy(base), adapters={"one": None})
