"""命令行 lm-finetune：写出适配器文件与合并后的检查点；lm-generate（--checkpoint 与 --adapter）、save_hf 与
serve（--model 与 --adapter）都接受它们，而且结果一致。"""

import copy

import pytest
import torch

from tformer_lib.commands.cli import main
from tformer_lib.finetune import AdapterSet, apply_adapter, load_adapter, merge_lora
from tformer_lib.lm import generate
from tformer_lib.lm.pretrained import load_poem_model
from tformer_lib.lm.training import load_lm
from tformer_lib.specials import EOS


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    out = tmp_path_factory.mktemp("ft")
    argv = ["--threads", "1", "lm-finetune", "--steps", "2", "--lora-rank", "4", "--lr", "0.05",
            "--adapter-out", str(out / "dufu.lora.pt"), "--out", str(out / "dufu.pt")]
    assert main(argv) == 0
    return out


@pytest.mark.slow
def test_lm_finetune_writes_an_adapter_and_a_merged_checkpoint_that_agree(finetuned, capsys):
    adapter = load_adapter(finetuned / "dufu.lora.pt")
    assert adapter["rank"] == 4 and adapter["extra"]["author"] == "杜甫" and adapter["extra"]["steps"] == 2
    merged, tokenizer, ckpt = load_lm(finetuned / "dufu.pt")
    assert ckpt["extra"]["finetune"]["method"] == "lora"
    base, _, _ = load_poem_model()
    rebuilt = merge_lora(apply_adapter(copy.deepcopy(base), adapter))
    tokens = torch.tensor([tokenizer.encode("五律《春望》国破山河在", add_bos=True)])
    with torch.no_grad():
        assert torch.equal(rebuilt(tokens), merged(tokens))
        assert not torch.equal(base(tokens), merged(tokens))  # 训练确实改了模型
    capsys.readouterr()
    args = ["lm-generate", "--form", "五律", "--title", "春望", "--temperature", "0"]
    assert main(args + ["--checkpoint", str(finetuned / "dufu.pt")]) == 0
    from_checkpoint = capsys.readouterr().out
    assert main(args + ["--adapter", str(finetuned / "dufu.lora.pt")]) == 0
    assert capsys.readouterr().out == from_checkpoint and from_checkpoint.strip()


@pytest.mark.slow
def test_a_qlora_adapter_generates_what_its_merged_checkpoint_generates(tmp_path, capsys):
    # QLoRA 的支路是对着 int4 底座学的：lm-generate --adapter 要先把底座量化成同一格式，才与合并后的检查点一致
    argv = ["--threads", "1", "lm-finetune", "--method", "qlora", "--steps", "1", "--lora-rank", "4", "--lr", "0.05",
            "--adapter-out", str(tmp_path / "q.pt"), "--out", str(tmp_path / "qm.pt")]
    assert main(argv) == 0
    assert load_adapter(tmp_path / "q.pt")["base_format"] == "int4-g64"
    capsys.readouterr()
    args = ["lm-generate", "--form", "七绝", "--title", "秋兴", "--temperature", "0", "--num", "2"]
    assert main(args + ["--checkpoint", str(tmp_path / "qm.pt")]) == 0
    from_checkpoint = capsys.readouterr().out
    assert main(args + ["--adapter", str(tmp_path / "q.pt")]) == 0
    assert capsys.readouterr().out == from_checkpoint and from_checkpoint.strip()


@pytest.mark.slow
def test_the_merged_checkpoint_round_trips_through_save_hf(finetuned, tmp_path):
    pytest.importorskip("safetensors")
    from tformer_lib.lm import load_hf, save_hf

    merged, tokenizer, _ = load_lm(finetuned / "dufu.pt")
    save_hf(merged, tmp_path / "hf", tokenizer=tokenizer)
    again, _ = load_hf(tmp_path / "hf")
    tokens = torch.tensor([tokenizer.encode("七绝《登高》", add_bos=True)])
    with torch.no_grad():
        assert torch.allclose(again(tokens), merged(tokens), atol=1e-5)


@pytest.mark.slow
def test_serve_offers_each_adapter_as_a_model_and_mixes_them_in_one_batch(finetuned, serve_in_thread):
    openai = pytest.importorskip("openai")
    from tformer_lib.serving import create_app

    base, tokenizer, _ = load_poem_model()
    merged, _, _ = load_lm(finetuned / "dufu.pt")
    served = copy.deepcopy(base)
    adapters = AdapterSet(served, {"dufu": load_adapter(finetuned / "dufu.lora.pt")})
    app = create_app(served, tokenizer, model_name="poem", max_batch=4, eos_id=EOS, adapters=adapters)
    prompt = "五言律诗《春望》"
    ids = tokenizer.encode(prompt, add_bos=True)
    with serve_in_thread(app) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=60, max_retries=0)
        assert [m.id for m in client.models.list().data] == ["poem", "dufu"]
        replies = {}
        for name in ("poem", "dufu"):
            reply = client.completions.create(model=name, prompt=prompt, max_tokens=12, temperature=0)
            assert reply.model == name
            replies[name] = reply.choices[0].text
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="libai", prompt=prompt, max_tokens=2)
    for name, model in (("poem", base), ("dufu", merged)):
        want = generate(model, ids, 12, method="greedy", eos_id=EOS).tolist()
        assert replies[name] == tokenizer.decode([t for t in want if t != EOS])
    assert replies["poem"] != replies["dufu"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["lm-finetune", "--steps", "2"], "--out"),
        (["lm-finetune", "--method", "full", "--adapter-out", "a.pt"], "--adapter-out"),
        (["lm-finetune", "--steps", "0", "--out", "m.pt"], "--steps"),
        (["lm-finetune", "--lr", "-1", "--out", "m.pt"], "--lr"),
        (["lm-generate", "--adapter", "/nonexistent/a.pt"], "找不到适配器"),
        (["lm-finetune", "--adapter-out", "same.pt", "--out", "./same.pt"], "同一个文件"),
        (["lm-finetune", "--adapter-out", "tests/conftest.py/a.pt"], "--adapter-out"),  # 上级是文件：训练之前就拒绝
        (["serve", "--adapter", "dufu"], "NAME=PATH"),
        (["serve", "--adapter", "a=x.pt", "--adapter", "a=y.pt"], "两次"),
    ],
)
def test_errors_are_one_line(argv, words, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("错误：") and words in err and "\n" not in err
