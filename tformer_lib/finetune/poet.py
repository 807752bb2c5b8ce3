"""微调的任务：让随书唐诗模型学一位诗人（默认杜甫）的诗，并量它学到了多少、又忘了多少。

随书模型在 train 划分的全部 31,768 首诗上预训练，其中杜甫 842 首；微调只在这 842 首上继续训练。这些诗模型都见过，
所以要量的是在**没见过**的杜甫诗上（valid 与 test 划分里他的诗）困惑度降了多少；代价是“遗忘”
（catastrophic forgetting）：在其他诗人没见过的诗上困惑度升了多少。

划分沿用语料本身的 train / valid / test（按正文的哈希，与作者无关）：

* ``train_blocks``：目标诗人在 train 里的诗，打包成定长块（与预训练相同的 :func:`~tformer_lib.lm.pack_documents`）；
* ``target_valid`` / ``target_test``：目标诗人在 valid / test 里的诗（选学习率用 valid，报告用 test）；
* ``others_test``：其他诗人在 test 里的诗（量遗忘）。
"""

from __future__ import annotations

from ..data.poems import load_poems
from ..lm.data import encode_documents, loss_targets, pack_documents, pad_documents, split_documents

__all__ = ["poet_documents", "poet_data", "poet_counts"]


def poet_documents(split: str, author: str, *, others: bool = False) -> list[str]:
    """``split`` 里 ``author`` 的诗的文档文本（``others=True`` 时为其他所有诗人的）；题目规则与预训练相同。"""
    if not isinstance(author, str) or not author:
        raise TypeError(f"author 应是诗人的名字（如 '杜甫'），收到 {author!r}")
    poems = load_poems(split)
    if not others and not any(p.author == author for p in poems):
        raise ValueError(f"{split} 划分里没有作者为 {author!r} 的诗；诗多的作者见 poet_counts()")
    # split_documents 与 load_poems 同序：文档与预训练看到的逐字相同（题目规则按诗在整个划分里的编号）
    return [doc for doc, p in zip(split_documents(split), poems) if (p.author == author) != others]


def poet_counts(split: str = "train", top: int = 10) -> list[tuple[str, int]]:
    """``split`` 里诗最多的 ``top`` 位作者与各自的首数。"""
    from collections import Counter

    return Counter(p.author for p in load_poems(split)).most_common(top)


def poet_data(tokenizer, author: str = "杜甫", *, block_len: int = 129, seed: int = 0) -> dict:
    """微调与评估的张量：``train_blocks`` ``(N, block_len)``，以及 ``target_valid``、``target_test``、``others_test``
    三组逐首诗的 ``(inputs, targets)``（与 :func:`~tformer_lib.lm.lm_perplexity` 的参数相同）。"""
    def encoded(split, others=False):
        return encode_documents(poet_documents(split, author, others=others), tokenizer)

    return {
        "author": author,
        "train_blocks": pack_documents(encoded("train"), block_len, seed=seed),
        "target_valid": loss_targets(pad_documents(encoded("valid"))),
        "target_test": loss_targets(pad_documents(encoded("test"))),
        "others_test": loss_targets(pad_documents(encoded("test", others=True))),
    }
