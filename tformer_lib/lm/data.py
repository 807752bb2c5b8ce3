"""把唐诗变成语言模型的训练数据：每首诗一篇“文档”，再打包（packing）成定长的块（block）。

一篇文档 = ``BOS + 体裁 + 《题目》 + 正文 + EOS``，例如::

    <bos>五绝《登鹳雀楼》白日依山尽，黄河入海流。欲穷千里目，更上一层楼。<eos>

开头的两个字（五绝 / 七绝 / 五律 / 七律）说明体裁，生成时把它放进提示（prompt），就能“点播”体裁；
每 5 首里有 1 首（按编号）以及题目超过 :data:`MAX_TITLE` 个字的诗不带题目（``《》``），
这样模型也学会只凭体裁与首字作诗。

打包：文档按种子打乱后依次装进长度 ``block_len = max_len + 1`` 的块，装不下的文档整篇放到下一块
（块总从一篇文档的开头起，所以至少块里的第一首与生成时从 BOS、位置 0 开始的情形一致），块尾用 PAD 补齐，PAD 不计损失。

打包不是免费的：只用因果掩码时，块里后面的诗看得见前面几首（与它无关的上文），位置编号也接着前一首往下数，
而生成时每首诗都从位置 0 开始。:func:`document_layout` 给出“每篇文档各自从位置 0 数、只看自己”的
位置与注意力掩码（文档掩码，document masking），训练时由 ``LMTrainer(document_mask=True)`` 打开。
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from .._checks import non_empty_sequence, positive_int, tensor_with_dim
from ..data.poems import Poem, load_poems
from ..parts.masks import causal_mask
from ..specials import BOS, EOS, PAD
from ..text import CharTokenizer

__all__ = [
    "FORM_CODES", "MAX_TITLE", "poem_document", "poem_prompt", "split_documents", "build_poem_tokenizer",
    "pack_documents", "stream_blocks", "encode_documents",
]

#: 体裁 → 文档开头的两个字
FORM_CODES = {"五言绝句": "五绝", "七言绝句": "七绝", "五言律诗": "五律", "七言律诗": "七律"}
#: 题目最多几个字；更长的题目省略
MAX_TITLE = 12


def _keeps_title(poem: Poem, index: int) -> bool:
    return index % 5 != 4 and 0 < len(poem.title) <= MAX_TITLE and "《" not in poem.title and "》" not in poem.title


def poem_prompt(form: str, title: str = "", first: str = "") -> str:
    """提示文本：``体裁 + 《题目》 + 首字``，如 ``poem_prompt("五言绝句", "春晓")`` → ``"五绝《春晓》"``。

    它只拼字符串、不认识词表；题目或首字里的词表外字在编码时（``tokenizer.encode``、:func:`sample_poems`）被警告。
    """
    if form not in FORM_CODES:
        raise ValueError(f"form 应是 {tuple(FORM_CODES)} 之一，收到 {form!r}")
    return f"{FORM_CODES[form]}《{title}》{first}"


def poem_document(poem: Poem, with_title: bool = True) -> str:
    """一首诗的文档文本（不含 BOS/EOS）：``"五绝《登鹳雀楼》白日依山尽，……"``。"""
    return poem_prompt(poem.form, poem.title if with_title else "") + poem.text


def split_documents(split: str) -> list[str]:
    """一个划分里全部诗的文档文本，顺序与 :func:`~tformer_lib.data.poems.load_poems` 相同。"""
    return [poem_document(p, _keeps_title(p, i)) for i, p in enumerate(load_poems(split))]


def build_poem_tokenizer(min_freq: int = 5) -> CharTokenizer:
    """在训练划分的文档上建字符词表；出现少于 ``min_freq`` 次的字记作 UNK（默认 5：约 0.2% 的字）。

    长尾的生僻字各只出现几次，模型学不会它们，却要在输出层为每个字付出 d_model 个参数和一份计算。
    """
    return CharTokenizer.build(split_documents("train"), min_freq=min_freq)


def encode_documents(documents: Sequence[str], tokenizer) -> list[list[int]]:
    """每篇文档 → ``[BOS, …, EOS]``。低频字按设计记作 UNK（见 :func:`build_poem_tokenizer`），这里不为它们警告。"""
    if isinstance(tokenizer, CharTokenizer):
        return [tokenizer.encode(doc, add_bos=True, add_eos=True, on_unknown="ignore") for doc in documents]
    return [tokenizer.encode(doc, add_bos=True, add_eos=True) for doc in documents]


def pack_documents(docs: Sequence[Sequence[int]], block_len: int, seed: int | None = 0, open_blocks: int = 8) -> torch.Tensor:
    """把文档（各自以 BOS 开头、EOS 结尾）打包成 ``(N, block_len)`` 的块，块尾补 PAD。

    首次适应（first fit）：同时开着 ``open_blocks`` 个块，每篇文档放进第一个装得下的块；都装不下时
    把最满的块封口、另开一个。唐诗训练划分、``block_len=129`` 时，开 8 个块约 91% 的位置是真实词元，只开 1 个块约 78%。
    ``seed`` 给出时先打乱文档顺序（同一种子永远得到同样的块）；比 ``block_len`` 还长的文档报错。
    """
    order = list(range(len(docs)))
    if seed is not None:
        random.Random(seed).shuffle(order)
    done: list[list[int]] = []
    current: list[list[int]] = []
    for i in order:
        doc = list(docs[i])
        if len(doc) > block_len:
            raise ValueError(f"第 {i} 篇文档有 {len(doc)} 个词元，超过 block_len={block_len}")
        home = next((b for b in current if len(b) + len(doc) <= block_len), None)
        if home is None:
            if len(current) >= open_blocks:
                fullest = max(current, key=len)
                current.remove(fullest)
                done.append(fullest)
            home = []
            current.append(home)
        home += doc
    done += current
    return torch.tensor([b + [PAD] * (block_len - len(b)) for b in done], dtype=torch.long)  # (N, block_len)


def stream_blocks(docs: Sequence[Sequence[int]], block_len: int, seed: int | None = 0) -> torch.Tensor:
    """把文档首尾相接成一条词元流，切成互不重叠的 ``(N, block_len)`` 块（GPT 式；文档可以跨块，末尾不满一块的丢掉）。

    与 :func:`pack_documents` 不同，块里没有 PAD，文档也可以比 ``block_len`` 长——第 16 章在比训练长度长几倍的
    窗口上量困惑度时用它。``seed`` 给出时先打乱文档顺序。
    """
    positive_int("block_len", block_len)
    order = list(range(len(docs)))
    if seed is not None:
        random.Random(seed).shuffle(order)
    stream = torch.tensor([t for i in order for t in docs[i]])  # (词元总数,)
    if stream.numel() and (stream.dtype != torch.long or int(stream.min()) < 0 or bool((stream == PAD).any())):
        raise ValueError(f"docs 应是非负整数词元 id 的序列、不含 PAD（id {PAD}），收到 dtype={stream.dtype}、"
                         f"最小值 {stream.min().item()}")
    n = stream.numel() // block_len
    if n == 0:
        raise ValueError(f"文档共 {stream.numel()} 个词元，不够一块 block_len={block_len}")
    return stream[: n * block_len].view(n, block_len)  # (N, block_len)


def pad_documents(docs: Sequence[Sequence[int]], length: int | None = None) -> torch.Tensor:
    """每篇文档单独一行、右侧补 PAD：``(N, length)``，默认 ``length`` = 最长文档的长度。评估“逐首诗”的困惑度时用。"""
    length = max(len(d) for d in docs) if length is None else length
    if any(len(d) > length for d in docs):
        raise ValueError(f"有文档长于 length={length}")
    return torch.tensor([list(d) + [PAD] * (length - len(d)) for d in docs], dtype=torch.long)  # (N, length)


def loss_targets(block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """块 ``(B, L+1)`` → 输入 ``(B, L)`` 与目标 ``(B, L)``（右移一位）；PAD 与 BOS 目标记为 PAD（不计损失）。

    BOS 不是文本：文档边界之后的“下一篇从 BOS 开始”不需要预测。
    """
    inputs, targets = block[:, :-1], block[:, 1:].clone()  # (B, L), (B, L)
    targets[targets == BOS] = PAD
    return inputs, targets


def document_layout(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """文档掩码（document masking，也叫 intra-document masking）：一个打包的块里，每篇文档各算各的。

    ``tokens``：``(N, T)`` 的词元 id，通常是 :func:`loss_targets` 给出的输入（块去掉最后一个词元）。
    返回 ``(positions, attn_mask)``，可直接交给 ``model(tokens, positions=…, attn_mask=…)``：

    - ``positions`` ``(N, T)``：每遇到一个 BOS，位置编号从 0 重新数起；第一个 BOS 之前的词元（上一块延续过来的
      文档尾巴，:func:`stream_blocks` 的块会有）从 0 数；PAD 的位置记 0。
    - ``attn_mask`` ``(N, 1, T, T)``，布尔，True = 可以关注：查询 i 只看同一篇文档里、不在它之后（j ≤ i）的
      非 PAD 词元，即“分块对角 + 因果”；PAD 查询只看它自己（每行至少一个 True，softmax 不会出 NaN；
      PAD 的目标本来就不计损失，它们也不被任何真实词元看见）。

    这样，块里每首诗得到的 logits 与把它单独从位置 0 送进模型时相同（测试保证，误差在 1e-5 内）。
    """
    tensor_with_dim("tokens", tokens, 2, "(N, T)")
    non_empty_sequence("tokens", tokens, seq_dim=1)
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.is_complex():
        raise TypeError(f"tokens 应是整数类型的词元 id，收到 dtype {tokens.dtype}")
    if tokens.numel() and int(tokens.min()) < 0:
        raise ValueError(f"tokens 应是非负的词元 id，收到最小值 {int(tokens.min())}")
    length = tokens.shape[1]
    is_bos, is_pad = tokens == BOS, tokens == PAD  # (N, T), (N, T)
    index = torch.arange(length, device=tokens.device).expand_as(tokens)  # (N, T)
    # 每个词元所在文档的起点：到它为止最后一个 BOS 的下标（之前没有 BOS 时是 0）
    start = torch.where(is_bos, index, torch.zeros_like(index)).cummax(dim=1).values  # (N, T)
    positions = (index - start).masked_fill(is_pad, 0)  # (N, T)
    doc = is_bos.long().cumsum(dim=1)  # (N, T)：第几篇文档（第一个 BOS 之前记作第 0 篇）
    same_doc = doc[:, :, None] == doc[:, None, :]  # (N, T_q, T_k)
    real = ~is_pad  # (N, T)
    mask = same_doc & causal_mask(length, device=tokens.device) & real[:, :, None] & real[:, None, :]  # (N, T, T)
    mask = mask | torch.eye(length, dtype=torch.bool, device=tokens.device)  # PAD 查询只看自己
    return positions, mask.unsqueeze(1)  # (N, T), (N, 1, T, T)：在头这一维上广播


__all__ += ["loss_targets", "pad_documents", "document_layout"]
