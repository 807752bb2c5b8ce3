"""训练一步（前向 + 反向 + 优化器）的速度：我们的模型（快速注意力路径）vs ``torch.nn.Transformer``。

两边同一配置：同样的词嵌入（×√d_model）、正弦位置编码、输出线性层、dropout、Adam；
同一进程内 A/B 交替测量若干轮，报告中位数与比值（ours / torch，越小越好）。
另测显式注意力与快速注意力（SDPA）在长度 64–512 上的前向 + 反向耗时。

用法：python benchmarks/train_step.py [--threads 1] [--rounds 15]
"""

import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from tformer_lib import (
    PAD,
    MultiHeadAttention,
    TransformerConfig,
    causal_mask,
    make_model,
    padding_mask,
    sinusoidal_positional_encoding,
)


class TorchTransformerModel(nn.Module):
    """把 ``torch.nn.Transformer`` 配上与我们相同的嵌入、位置编码和输出层。"""

    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.d_model = c.d_model
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model)
        self.tgt_embed = nn.Embedding(c.tgt_vocab_size, c.d_model)
        self.register_buffer("pe", sinusoidal_positional_encoding(c.max_len, c.d_model))
        self.dropout = nn.Dropout(c.dropout)
        self.core = nn.Transformer(
            c.d_model, c.n_heads, c.n_encoder_layers, c.n_decoder_layers, c.d_ff, c.dropout, batch_first=True
        )
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)

    def embed(self, lut: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        x = lut(tokens) * math.sqrt(self.d_model)  # (B, T, d_model)
        return self.dropout(x + self.pe[: tokens.shape[1]])

    def forward(self, src, tgt_in):
        t = tgt_in.shape[1]
        # PyTorch 的掩码极性与我们相反：True = 屏蔽
        out = self.core(
            self.embed(self.src_embed, src),
            self.embed(self.tgt_embed, tgt_in),
            tgt_mask=~causal_mask(t),
            src_key_padding_mask=src == PAD,
            tgt_key_padding_mask=tgt_in == PAD,
            memory_key_padding_mask=src == PAD,
        )
        return self.generator(out)  # (B, T, V)


def make_step(model: nn.Module, src, tgt_in, tgt_out):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    model.train()

    def step():
        logits = model(src, tgt_in)  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1), ignore_index=PAD)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def time_once(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(fns: dict, rounds: int, warmup: int = 2) -> dict:
    """A/B 交替：每一轮依次测每个函数一次，抵消机器负载的慢变化；返回各自的中位数（秒）。"""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(time_once(fn))
    return {name: statistics.median(times) for name, times in samples.items()}


def compare_train_step(label: str, config: TransformerConfig, batch: int, length: int, rounds: int) -> None:
    torch.manual_seed(0)
    src = torch.randint(4, config.src_vocab_size, (batch, length))
    tgt = torch.randint(4, config.tgt_vocab_size, (batch, length + 1))
    src[: batch // 4, -3:] = PAD  # 四分之一的句子带填充，让掩码真的起作用
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    ours = make_model(config)
    theirs = TorchTransformerModel(config)
    medians = interleaved(
        {"ours": make_step(ours, src, tgt_in, tgt_out), "torch": make_step(theirs, src, tgt_in, tgt_out)}, rounds
    )
    print(
        f"{label:<34} ours {medians['ours'] * 1e3:8.1f} ms   torch.nn.Transformer {medians['torch'] * 1e3:8.1f} ms"
        f"   ratio {medians['ours'] / medians['torch']:.2f}x"
    )


def compare_attention_paths(lengths, rounds: int, batch: int = 4, d_model: int = 256, n_heads: int = 8) -> None:
    for length in lengths:
        x = torch.randn(batch, length, d_model)
        tokens = torch.randint(4, 10, (batch, length))
        tokens[0, -length // 4 :] = PAD
        mask = padding_mask(tokens)  # (B, 1, 1, T)
        fns = {}
        for fast in (False, True):
            mha = MultiHeadAttention(d_model, n_heads, fast=fast)

            def fwd_bwd(mha=mha):
                mha(x, x, x, mask).sum().backward()

            fns["fast" if fast else "explicit"] = fwd_bwd
        medians = interleaved(fns, rounds)
        print(
            f"attention T={length:<4} explicit {medians['explicit'] * 1e3:7.1f} ms   fast (SDPA) "
            f"{medians['fast'] * 1e3:7.1f} ms   fast/explicit {medians['fast'] / medians['explicit']:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch 线程数（默认 1：共享的 2 核机器上更稳定）")
    parser.add_argument("--rounds", type=int, default=15, help="每组交替测量的轮数")
    parser.add_argument("--skip-base", action="store_true", help="跳过论文 base 配置（较慢）")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, rounds={args.rounds}, median of each\n")
    small = TransformerConfig(1000, 1000, d_model=128, n_heads=4, d_ff=512, n_encoder_layers=2,
                              n_decoder_layers=2, fast_attention=True)
    compare_train_step("small (128/4/512, 2+2, B=64, T=20)", small, batch=64, length=20, rounds=args.rounds)
    if not args.skip_base:
        base = TransformerConfig(8000, 8000, fast_attention=True)
        compare_train_step("base (512/8/2048, 6+6, B=8, T=32)", base, batch=8, length=32,
                           rounds=max(3, args.rounds // 3))
    print()
    compare_attention_paths([64, 128, 256, 512], rounds=args.rounds)


if __name__ == "__main__":
    main()
