"""消融实验（ablation）：去掉前馈网络（feed-forward network，FFN），看玩具翻译任务还学不学得会。

第 4 章问“注意力后面为什么还要接 FFN”。这里给出可复现的回答：在书中的玩具中→英任务上，用与
随包模型完全相同的训练配方（:data:`~tformer_lib.translation.pretrained.TOY_TRAINING`）训练三组模型，每组 3 个种子：

- ``"baseline"``：书中的玩具模型（编码器/解码器各 2 层，每层有 FFN）；
- ``"no_ffn"``：同样的 2+2 层，但每层的 FFN 子层输出恒为 0（残差与 LayerNorm 保留，所以子层变成
  ``LayerNorm(x + 0)``），参数约少一半；
- ``"no_ffn_deeper"``：没有 FFN，但把省下的参数花在注意力上——编码器 4 层、解码器 3 层，
  参数量与 ``baseline`` 相差不到 1%。

:func:`run_ffn_ablation` 训练并返回结果；:func:`write_ffn_ablation_results` 把结果连同机器、线程数、
torch 版本与日期写进 JSON；随包附带的 ``results/ffn_ablation.json`` 就是维护者用下面的命令在单线程下生成的::

    .venv/bin/python -m tformer_lib.experiments.ablations

:func:`load_ffn_ablation_results` 读回它（第 4 章用它画图，笔记本里不必再训练 9 个模型）。
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from ..measurement.benchmarking import machine_info, read_results, save_results
from ..seed import set_seed
from ..training.trainer import Trainer, evaluate
from ..translation.model import Transformer, count_parameters, make_model
from ..translation.pretrained import TOY_TRAINING, load_toy_data, preserve_global_rng, toy_model_config

__all__ = [
    "ZeroFeedForward",
    "drop_feed_forward",
    "FFN_ABLATION_ARMS",
    "make_ablation_model",
    "run_ffn_ablation",
    "write_ffn_ablation_results",
    "load_ffn_ablation_results",
    "FFN_ABLATION_RESULTS",
]

#: 随包附带的结果文件
#: 重新生成 :data:`FFN_ABLATION_RESULTS` 的命令（写进结果文件）
COMMAND = "python -m tformer_lib.experiments.ablations"
FFN_ABLATION_RESULTS = Path(__file__).resolve().parent.parent / "results" / "ffn_ablation.json"

#: 三组模型：名字 → (toy_model_config 的覆盖项, 是否去掉 FFN)
FFN_ABLATION_ARMS: dict[str, tuple[dict, bool]] = {
    "baseline": ({}, False),
    "no_ffn": ({}, True),
    "no_ffn_deeper": ({"n_encoder_layers": 4, "n_decoder_layers": 3}, True),
}


class ZeroFeedForward(nn.Module):
    """代替 FFN 的“空子层”：输出与输入同形状的全 0，没有参数。"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)  # (B, T, d_model)


def drop_feed_forward(model: Transformer) -> Transformer:
    """把模型里每个编码器层、解码器层的 ``feed_forward`` 换成 :class:`ZeroFeedForward`（原地修改并返回）。

    残差与层归一化保留：post-LN 时 FFN 子层变成 ``LayerNorm(x)``，pre-LN 时变成恒等映射。
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"model 应是 make_model 得到的 Transformer，收到 {type(model).__name__}")
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        layer.feed_forward = ZeroFeedForward()
    return model


def make_ablation_model(arm: str, src_vocab_size: int, tgt_vocab_size: int, seed: int = 0) -> Transformer:
    """按 :data:`FFN_ABLATION_ARMS` 里的一组搭出（已初始化的）玩具模型；调用前后全局随机状态不变。"""
    if arm not in FFN_ABLATION_ARMS:
        raise ValueError(f"arm 应是 {sorted(FFN_ABLATION_ARMS)} 之一，收到 {arm!r}")
    overrides, no_ffn = FFN_ABLATION_ARMS[arm]
    with preserve_global_rng():
        set_seed(seed)
        model = make_model(toy_model_config(src_vocab_size, tgt_vocab_size, **overrides))
    return drop_feed_forward(model) if no_ffn else model


def run_ffn_ablation(seeds=(0, 1, 2), arms=tuple(FFN_ABLATION_ARMS), epochs: int | None = None,
                     verbose: bool = False) -> dict:
    """用玩具模型的训练配方训练每组、每个种子，返回 ``{"runs": [...], "settings": {...}}``。

    每个 run 记录组名、种子、参数量、每个 epoch 的验证指标（loss、token_accuracy、exact_match、bleu）
    与训练结束时测试集上的指标。调用前后全局随机状态不变。单线程下每个 run 约半分钟到一分钟。
    """
    data = load_toy_data(TOY_TRAINING["corpus_seed"])
    training = dict(TOY_TRAINING)
    if epochs is not None:
        training["epochs"] = epochs
    runs = []
    with preserve_global_rng():
        for arm in arms:
            for seed in seeds:
                model = make_ablation_model(arm, len(data["src_vocab"]), len(data["tgt_vocab"]), seed)
                trainer = Trainer(
                    model, data["train"], data["valid"], tgt_vocab=data["tgt_vocab"],
                    batch_size=training["batch_size"], warmup=training["warmup"],
                    lr_factor=training["lr_factor"], label_smoothing=training["label_smoothing"],
                    clip_grad_norm=training["clip_grad_norm"], eval_decode=training["eval_decode"], seed=seed,
                )
                history = trainer.fit(training["epochs"])
                test = evaluate(model, data["test"], data["tgt_vocab"])
                keys = ("valid_loss", "valid_token_accuracy", "valid_exact_match", "valid_bleu")
                run = {
                    "arm": arm,
                    "seed": seed,
                    "parameters": count_parameters(model),
                    "epochs": [{k: e[k] for k in ("epoch", "step", "train_loss", *keys) if k in e}
                               for e in history.epochs],
                    "test": test,
                }
                runs.append(run)
                if verbose:
                    print(arm, seed, run["parameters"], {k: round(v, 4) for k, v in test.items()}, flush=True)
    return {"runs": runs, "settings": {"training": training, "seeds": list(seeds), "arms": list(arms)}}


def write_ffn_ablation_results(path: str | os.PathLike = FFN_ABLATION_RESULTS, **kwargs) -> Path:
    """（维护者用）单线程运行 :func:`run_ffn_ablation`，连同机器信息写成 JSON（先写临时文件再改名）。"""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    machine = machine_info()  # 单线程之下、开始训练时记下
    try:
        result = run_ffn_ablation(**kwargs)
    finally:
        torch.set_num_threads(previous)
    result["produced_by"] = {"command": COMMAND, **machine}
    return save_results(result, path)


def load_ffn_ablation_results(path: str | os.PathLike = FFN_ABLATION_RESULTS) -> dict:
    """读回 :func:`write_ffn_ablation_results` 写的 JSON。"""
    return read_results(path, COMMAND)


if __name__ == "__main__":  # pragma: no cover - 维护者脚本
    print(write_ffn_ablation_results(verbose=True))
