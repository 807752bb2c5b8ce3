"""位置编码的长度外推（length generalization）实验：在短序列上训练，在更长的序列上测试。

任务是“反转”（reverse）：输入 ``a b c d`` → 输出 ``d c b a``。输出第 t 个词要看输入倒数第 t 个词，
位置信息缺一不可。我们用同一份数据、同一个小模型、同样的训练步数，只换位置编码
（``TransformerConfig.positional``：正弦余弦 / 可学习 / 不用），训练长度 3–8，测试长度 3–14，
每个长度报告整句完全正确（exact match，贪心解码）的比例，以及教师强制下逐词元的准确率（token accuracy）。

训练要几十秒到几分钟（2 核 CPU、单线程），所以书里读的是 :func:`run` 写下的结果文件
``tformer_lib/results/length_generalization.json``（记录了机器、线程数、日期与全部设置）；
重新生成：``python -m tformer_lib.experiments.length_generalization``。
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..measurement.benchmarking import machine_info, read_results, save_results

RESULTS_PATH = Path(__file__).resolve().parent.parent / "results" / "length_generalization.json"
#: 重新生成随包结果文件的命令（写进文件里；scripts/regenerate_results.py 运行的也是它）
COMMAND = "python -m tformer_lib.experiments.length_generalization"

DEFAULTS = dict(positional=("sinusoidal", "learned", "none"), train_min_len=3, train_max_len=8, test_lengths=tuple(range(3, 15)),
                n_train=4000, n_test_per_length=100, epochs=16, d_model=64, n_heads=4, d_ff=128, n_layers=2,
                max_len=32, seed=0)


def _encode(pairs, vocab):
    from ..data import encode_pairs

    return encode_pairs(pairs, vocab, vocab)


def run(**overrides) -> dict:
    """按 :data:`DEFAULTS`（可用关键字覆盖）训练每种位置编码一次，返回结果字典（不写文件）。"""
    from .. import TransformerConfig, make_model
    from ..data import make_reverse_task, synthetic_vocab
    from ..training import Trainer, evaluate

    cfg = {**DEFAULTS, **overrides}
    vocab = synthetic_vocab(10)
    train = _encode(make_reverse_task(cfg["n_train"], min_len=cfg["train_min_len"], max_len=cfg["train_max_len"],
                                      seed=cfg["seed"]), vocab)
    tests = {L: _encode(make_reverse_task(cfg["n_test_per_length"], min_len=L, max_len=L, seed=1000 + L), vocab)
             for L in cfg["test_lengths"]}
    out: dict = {}
    for kind in cfg["positional"]:
        torch.manual_seed(cfg["seed"])
        model = make_model(TransformerConfig(
            src_vocab_size=len(vocab), tgt_vocab_size=len(vocab), d_model=cfg["d_model"], n_heads=cfg["n_heads"],
            d_ff=cfg["d_ff"], n_encoder_layers=cfg["n_layers"], n_decoder_layers=cfg["n_layers"], dropout=0.0,
            max_len=cfg["max_len"], positional=kind))
        trainer = Trainer(model, train, batch_size=64, warmup=200, seed=cfg["seed"], progress=False,
                          eval_decode=False)
        history = trainer.fit(cfg["epochs"])
        model.eval()
        metrics = {L: evaluate(model, data, max_len=L + 2) for L, data in tests.items()}
        out[kind] = {"exact_match": {str(L): float(m["exact_match"]) for L, m in metrics.items()},
                     "token_accuracy": {str(L): float(m["token_accuracy"]) for L, m in metrics.items()},
                     "final_train_loss": float(history.step_loss[-1]), "steps": trainer.step}
        if kind == "learned":  # 训练后编码器位置表的余弦相似度（前 16 个位置），用来看学到了什么结构
            table = model.src_pos.embedding.weight.detach()[:16]  # (16, d_model)
            cos = torch.nn.functional.cosine_similarity(table[:, None], table[None], dim=-1)  # (16, 16)
            out[kind]["encoder_table_cosine"] = [[round(float(v), 4) for v in row] for row in cos]
    return {"settings": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}, "results": out,
            "machine": machine_info(), "command": COMMAND}


def load_results(path: Path | str = RESULTS_PATH) -> dict:
    """读取 :func:`run` 写下的结果文件。"""
    return read_results(path, COMMAND)


def main() -> None:  # pragma: no cover - 手动运行
    torch.set_num_threads(1)
    result = run()
    save_results(result, RESULTS_PATH)
    print(json.dumps(result["results"], ensure_ascii=False, indent=1))


if __name__ == "__main__":  # pragma: no cover
    main()
