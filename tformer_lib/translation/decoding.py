"""解码（decoding）：用训练好的模型逐词生成译文。

三种策略，都支持 K/V 缓存（KV cache，见 :mod:`tformer_lib.parts.kv_cache`）：

* 贪心解码（greedy decoding）：每步取概率最大的词，批量进行，遇到 EOS 的句子停下；
* 束搜索（beam search）：每步保留得分最高的 ``beam_size`` 个候选，用长度惩罚（length penalty）
  比较长短不同的候选；
* 采样（sampling）：按 softmax 概率抽词，可用温度（temperature）与 top-k 调节随机性。

有缓存时每步只把「新生成的一个词」送进解码器，已生成位置的 K、V 从缓存里取；
没有缓存时每步把整个前缀重新算一遍。两者的 logits 逐步相同，三种策略生成的词元也相同
（测试在几十个随机初始化的模型上核对），只是快慢不同。

三种策略都**不会生成 PAD 与 BOS**：它们只是填充和开头的记号，不是真正的词。未训练或很弱的模型
完全可能把最高分给 ``<pad>``，所以每一步都先把这两个词的分数置为 −∞（:func:`forbid_special_tokens`）。

默认最多生成 ``S + 10`` 个词，但不超过模型位置编码能表示的长度 ``config.max_len``；
调用者自己给的 ``max_len`` 超过它时立即报错，而不是解码到一半才失败。

返回格式统一：``(B, L)`` 的 LongTensor，不含 BOS；生成了 EOS 的行在 EOS 之后全是 PAD。
用 :func:`ids_to_lists` 或 ``Vocab.decode`` 把它变回词元。
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch
from torch import nn

from .._checks import one_of, positive_int
from ..parts.masks import padding_mask
from ..specials import BOS, EOS, PAD
from ..temperature import apply_temperature, check_temperature, is_greedy_temperature
from ..unknown_tokens import UnknownTokenError, UnknownTokenWarning, report_unknown

__all__ = [
    "greedy_decode",
    "beam_search",
    "sample_decode",
    "ids_to_lists",
    "translate",
    "decoder_step_logits",
    "sequence_log_probs",
    "forbid_special_tokens",
    "UnknownTokenWarning",
    "UnknownTokenError",
]


@contextmanager
def _eval_mode(model: nn.Module):
    """解码时关掉 dropout，结束后恢复原来的 train/eval 状态。"""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _check_src(src: torch.Tensor) -> None:
    if not isinstance(src, torch.Tensor):
        raise TypeError(f"src 应是 (B, S) 的 LongTensor，收到 {type(src).__name__}")
    if src.dim() != 2 or src.shape[1] == 0:
        raise ValueError(f"src 应是形状 (B, S) 且 S ≥ 1 的张量，收到形状 {tuple(src.shape)}")
    if src.shape[0] == 0:
        raise ValueError(f"src 是空批次（形状 {tuple(src.shape)}）：至少要有一句（B ≥ 1）")


def model_max_len(model: nn.Module) -> int | None:
    """模型能表示的最长目标前缀（位置编码的 ``max_len``）；不加位置编码的模型没有上限（None）。"""
    config = getattr(model, "config", None)
    if getattr(config, "positional", None) == "none":
        return None
    limit = getattr(config, "max_len", None)
    return limit if isinstance(limit, int) else None


def _default_max_len(model: nn.Module, src: torch.Tensor, max_len: int | None) -> int:
    """要生成的最多词数：默认 ``S + 10`` 但不超过模型的 ``max_len``；调用者给得太大时报错。

    生成第 L 个词时解码器的输入是 BOS 加前 L−1 个词，共 L 个位置，所以 L 最多等于 ``config.max_len``。
    """
    limit = model_max_len(model)
    if max_len is None:
        default = src.shape[1] + 10
        return default if limit is None else min(default, limit)
    max_len = positive_int("max_len", max_len)
    if limit is not None and max_len > limit:
        raise ValueError(
            f"max_len={max_len} 超过了模型能表示的目标长度 config.max_len={limit}"
            f"（BOS 加生成的词共 max_len 个位置）；请把 max_len 设为 ≤ {limit}，或不传 max_len 用默认值"
        )
    return max_len


def forbid_special_tokens(scores: torch.Tensor, token_ids: Sequence[int]) -> torch.Tensor:
    """把 ``scores`` ``(..., V)`` 里 ``token_ids`` 这几列置为 −∞，解码就不会选到它们（如 PAD、BOS）。"""
    forbidden = sorted({int(t) for t in token_ids if 0 <= int(t) < scores.shape[-1]})
    if not forbidden:
        return scores
    scores = scores.clone()
    scores[..., forbidden] = float("-inf")
    return scores


def _forbidden_ids(model: nn.Module, bos: int, eos: int) -> list[int]:
    """解码时不许生成的词：PAD 与 BOS（若调用者把 EOS 设成同一个 id，EOS 仍然允许）。"""
    return [t for t in (model.config.pad_id, bos) if t != eos]


def decoder_step_logits(
    model: nn.Module,
    memory: torch.Tensor,
    src_mask: torch.Tensor,
    prefix: torch.Tensor,
    cache=None,
) -> torch.Tensor:
    """下一个词的 logits ``(B, V)``。

    有缓存：``prefix`` 只需是最新的一个词 ``(B, 1)``；无缓存：``prefix`` 是完整前缀 ``(B, t)``（含 BOS）。
    """
    hidden = model.decode(memory, prefix, src_mask, cache=cache)  # (B, T_new, d_model)
    return model.generator(hidden[:, -1:])[:, -1]  # (B, 1, V) → (B, V)


def _finish(out: torch.Tensor, eos: int, pad_id: int) -> torch.Tensor:
    """把每行第一个 EOS 之后的位置全部置为 PAD。"""
    is_eos = (out == eos).int()  # (B, L)
    after = (is_eos.cumsum(dim=1) - is_eos) > 0  # (B, L) 位于第一个 EOS 之后
    return out.masked_fill(after, pad_id)


def _generate(model, src, max_len, pick, use_cache, stop_at_eos, bos, eos) -> torch.Tensor:
    """贪心与采样共用的解码循环：``pick(logits) -> (B,)`` 决定每步选哪个词。"""
    _check_src(src)
    max_len = _default_max_len(model, src, max_len)
    pad_id = model.config.pad_id
    forbidden = _forbidden_ids(model, bos, eos)
    with _eval_mode(model), torch.no_grad():
        src_mask = padding_mask(src, pad_id)  # (B, 1, 1, S)
        memory = model.encode(src, src_mask)  # (B, S, d_model)
        B = src.shape[0]
        ys = torch.full((B, 1), bos, dtype=torch.long, device=src.device)  # (B, 1)，以 BOS 开头
        cache = model.new_cache() if use_cache else None
        done = torch.zeros(B, dtype=torch.bool, device=src.device)
        for _ in range(max_len):
            step_in = ys[:, -1:] if use_cache else ys  # 有缓存只送最新一个词
            logits = decoder_step_logits(model, memory, src_mask, step_in, cache)  # (B, V)
            next_tok = pick(forbid_special_tokens(logits, forbidden))  # (B,)，不会是 PAD 或 BOS
            next_tok = next_tok.masked_fill(done, pad_id)  # 已结束的句子只补 PAD
            ys = torch.cat([ys, next_tok[:, None]], dim=1)  # (B, t+1)
            done |= next_tok == eos
            if stop_at_eos and bool(done.all()):
                break
        out = ys[:, 1:]  # (B, L) 去掉 BOS
        return _finish(out, eos, pad_id) if stop_at_eos else out


def greedy_decode(
    model: nn.Module,
    src: torch.Tensor,
    max_len: int | None = None,
    use_cache: bool = True,
    stop_at_eos: bool = True,
    bos: int = BOS,
    eos: int = EOS,
) -> torch.Tensor:
    """批量贪心解码：``src`` ``(B, S)`` → 生成的 id ``(B, L)``，L ≤ ``max_len``
    （默认 S + 10，且不超过模型的 ``config.max_len``）。

    ``stop_at_eos=False`` 时总是生成满 ``max_len`` 个词（基准测试用）。
    """
    return _generate(model, src, max_len, lambda logits: logits.argmax(dim=-1), use_cache, stop_at_eos, bos, eos)


def sample_decode(
    model: nn.Module,
    src: torch.Tensor,
    max_len: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    bos: int = BOS,
    eos: int = EOS,
) -> torch.Tensor:
    """按概率采样：``softmax(logits / temperature)``，可只在概率最高的 ``top_k`` 个词里抽。

    温度 < 1 让分布更尖（更保守），> 1 更平（更多样）；``top_k=1`` 与 ``temperature=0`` 都等价于贪心
    （温度 0 直接走 :func:`greedy_decode`，不消耗随机数；很小的正温度也不会产生 NaN，见 :mod:`tformer_lib.temperature`）。
    传入 ``generator``（``torch.Generator().manual_seed(…)``）可复现。
    """
    if is_greedy_temperature(check_temperature("temperature", temperature)):
        return greedy_decode(model, src, max_len, use_cache, True, bos, eos)
    if top_k is not None:
        top_k = positive_int("top_k", top_k)

    def pick(logits: torch.Tensor) -> torch.Tensor:  # logits 里 PAD、BOS 已是 −∞
        logits = apply_temperature(logits, temperature)  # (B, V)：logits / T
        if top_k is not None and top_k < logits.shape[-1]:
            kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1) 第 k 大的分数
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = logits.softmax(dim=-1)  # (B, V)
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (B,)

    return _generate(model, src, max_len, pick, use_cache, True, bos, eos)


def _length_penalty(length: int, alpha: float) -> float:
    """GNMT 的长度惩罚 ``((5 + |y|) / 6)^α``；α = 0 时不惩罚（偏爱短句）。"""
    return ((5.0 + length) / 6.0) ** alpha


def _beam_one(model, src_row, max_len, beam_size, alpha, bos, eos, use_cache=True) -> list[int]:
    pad_id = model.config.pad_id
    forbidden = _forbidden_ids(model, bos, eos)
    src = src_row[None]  # (1, S)
    src_mask = padding_mask(src, pad_id)  # (1, 1, 1, S)
    memory = model.encode(src, src_mask)  # (1, S, d_model)
    cache = model.new_cache() if use_cache else None
    seqs = [[bos]]  # 存活的候选（含 BOS）
    scores = torch.zeros(1, device=src.device)  # (n,) 累计 log 概率
    finished: list[tuple[float, list[int]]] = []
    for step in range(max_len):
        n = len(seqs)
        if use_cache:
            step_in = torch.tensor([[s[-1]] for s in seqs], device=src.device)  # (n, 1)
            # 第一步之后交叉注意力的 K/V 已在缓存里（批次维已随 reorder 扩成 n），memory 只在第一步被读取
            step_memory, step_mask = memory, src_mask
        else:
            step_in = torch.tensor(seqs, device=src.device)  # (n, t) 所有候选一样长：整个前缀
            step_memory = memory.expand(n, -1, -1)  # (n, S, d_model)
            step_mask = src_mask.expand(n, -1, -1, -1)  # (n, 1, 1, S)
        logits = decoder_step_logits(model, step_memory, step_mask, step_in, cache)  # (n, V)
        # 先做 log_softmax 再禁词：候选得分仍是模型给的真实 log 概率（与 sequence_log_probs 一致）
        log_p = forbid_special_tokens(logits.log_softmax(dim=-1), forbidden)  # (n, V)，PAD、BOS 为 −∞
        cand = scores[:, None] + log_p  # (n, V) 每个候选续写每个词后的总分
        V = cand.shape[1]
        top_scores, top_idx = cand.view(-1).topk(min(2 * beam_size, n * V))  # 展平 (n·V,) 后取前 2k
        keep_rows, keep_seqs, keep_scores = [], [], []
        for score, idx in zip(top_scores.tolist(), top_idx.tolist()):
            if score == float("-inf"):
                break  # 只剩被禁止的词
            row, tok = divmod(idx, V)
            if tok == eos:
                seq = seqs[row][1:] + [eos]
                finished.append((score / _length_penalty(len(seq), alpha), seq))
            else:
                keep_rows.append(row)
                keep_seqs.append(seqs[row] + [tok])
                keep_scores.append(score)
            if len(keep_seqs) == beam_size:
                break
        seqs, scores = keep_seqs, torch.tensor(keep_scores, device=src.device)
        if not seqs:
            break
        if len(finished) >= beam_size:
            # 存活候选以后的总 log 概率只会更小（≤ 现在），长度惩罚最多除以 lp(max_len)：
            # 若已结束的最好候选不差于这个上界，再搜下去也赢不了，可以停
            bound = max(keep_scores) / _length_penalty(max_len, alpha)
            if max(f[0] for f in finished) >= bound:
                seqs = []
                break
        if cache is not None:
            cache.reorder(torch.tensor(keep_rows, device=src.device))  # 缓存跟着存活的候选重排
    # 到 max_len 仍存活的候选也参加比较（长度不含 BOS）
    finished += [(sc / _length_penalty(len(q) - 1, alpha), q[1:]) for sc, q in zip(scores.tolist(), seqs)]
    return max(finished, key=lambda t: t[0])[1]


def beam_search(
    model: nn.Module,
    src: torch.Tensor,
    beam_size: int = 4,
    max_len: int | None = None,
    length_penalty: float = 0.6,
    bos: int = BOS,
    eos: int = EOS,
    use_cache: bool = True,
) -> torch.Tensor:
    """束搜索：对 ``src`` 的每一句分别搜索（一句内的 ``beam_size`` 个候选成批计算，共用 K/V 缓存）。

    候选的最终得分 = 总 log 概率 / ``((5 + 长度) / 6) ** length_penalty``（GNMT）。
    已有 ``beam_size`` 个以 EOS 结束的候选、且存活候选（得分只会下降）不可能再超过其中最好者时停止。
    返回 ``(B, L)``，格式同 :func:`greedy_decode`。
    ``beam_size=1`` 时与贪心解码结果相同；``use_cache=False`` 每步重算整个前缀，结果与有缓存时相同。
    """
    _check_src(src)
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size 应为正整数，收到 {beam_size!r}")
    if not (isinstance(length_penalty, (int, float)) and length_penalty >= 0):
        raise ValueError(f"length_penalty 应为 ≥0 的数，收到 {length_penalty!r}")
    max_len = _default_max_len(model, src, max_len)
    pad_id = model.config.pad_id
    with _eval_mode(model), torch.no_grad():
        results = [_beam_one(model, row, max_len, beam_size, float(length_penalty), bos, eos, use_cache)
                   for row in src]
    L = max(1, max(len(r) for r in results))
    out = torch.full((len(results), L), pad_id, dtype=torch.long, device=src.device)  # (B, L)
    for i, r in enumerate(results):
        if r:
            out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def sequence_log_probs(model: nn.Module, src: torch.Tensor, out: torch.Tensor, bos: int = BOS) -> torch.Tensor:
    """每行解码结果的总 log 概率 ``(B,)``：``out`` 是解码函数的返回值（PAD 位不计，EOS 计入）。

    用教师强制一次前向算出，比较「束搜索是否真的找到了概率更高的句子」时很方便。
    """
    _check_src(src)
    if out.dim() != 2 or out.shape[0] != src.shape[0]:
        raise ValueError(f"out 应是 (B, L) 且 B 与 src 相同（{src.shape[0]}），收到形状 {tuple(out.shape)}")
    pad_id = model.config.pad_id
    tgt_in = torch.cat([torch.full_like(out[:, :1], bos), out[:, :-1]], dim=1)  # (B, L) 右移一位、以 BOS 开头
    with _eval_mode(model), torch.no_grad():
        log_p = model(src, tgt_in).log_softmax(dim=-1)  # (B, L, V)
    token_lp = log_p.gather(-1, out.unsqueeze(-1)).squeeze(-1)  # (B, L)
    return (token_lp * (out != pad_id)).sum(dim=1)  # (B,)


def ids_to_lists(ids: torch.Tensor, eos: int = EOS, pad_id: int = PAD) -> list[list[int]]:
    """``(B, L)`` 解码结果 → 每句一个 id 列表（截到 EOS 为止，不含 EOS 与 PAD）。"""
    out = []
    for row in ids.tolist():
        seq = []
        for t in row:
            if t == eos:
                break
            if t != pad_id:
                seq.append(t)
        out.append(seq)
    return out


def translate(
    model: nn.Module,
    sentences: str | Sequence[str],
    src_vocab,
    tgt_vocab,
    method: str = "greedy",
    beam_size: int = 4,
    max_len: int | None = None,
    length_penalty: float = 0.6,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    batch_size: int = 256,
    tokenize=None,
    on_unknown: str = "warn",
) -> str | list[str]:
    """把中文句子翻成英文字符串：``translate(model, "狗 咬 人", src_vocab, tgt_vocab)``。

    ``sentences`` 可以是一句（返回一句）或一个列表（返回列表）；``method`` 为
    ``"greedy"`` / ``"beam"`` / ``"sample"``。``tokenize`` 默认是玩具语料的中文分词
    （有空格按空格切，没有空格按词典最长匹配）。

    词表外的词（包括“。”这类标点）只能当作 ``<unk>``，模型会把它随便译成什么。``on_unknown`` 决定怎么办：
    ``"warn"``（默认）发出一个 :class:`UnknownTokenWarning`，列出这些词，照常翻译；
    ``"error"`` 抛出 ``ValueError``；``"ignore"`` 不作声。
    """
    if method not in ("greedy", "beam", "sample"):
        raise ValueError(f"method 应为 'greedy'、'beam' 或 'sample'，收到 {method!r}")
    positive_int("batch_size", batch_size)
    one_of("on_unknown", on_unknown, ("warn", "error", "ignore"))
    single = isinstance(sentences, str)
    if not single and not isinstance(sentences, Sequence):
        raise TypeError(f"sentences 应是一个字符串或字符串列表，收到 {type(sentences).__name__}")
    items = [sentences] if single else list(sentences)
    for i, s in enumerate(items):
        if not isinstance(s, str):
            raise TypeError(f"sentences[{i}] 应是字符串，收到 {type(s).__name__} {s!r}")
    if tokenize is None:
        from ..data.toy_zh_en import tokenize_zh as tokenize
    encoded = []
    unknown: dict[str, list[str]] = {}  # 句子 → 其中的词表外词
    for s in items:
        toks = tokenize(s)
        if not toks:
            raise ValueError(f"sentences 中有空句子：{s!r}")
        missing = [t for t in toks if t not in src_vocab]
        if missing:
            unknown[s] = missing
        encoded.append(src_vocab.encode(toks))
    if unknown and on_unknown != "ignore":
        _report_unknown(unknown, len(items), on_unknown)
    results: list[str] = []
    device = next(model.parameters()).device
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start : start + batch_size]
        S = max(len(x) for x in chunk)
        src = torch.full((len(chunk), S), model.config.pad_id, dtype=torch.long, device=device)  # (B, S)
        for i, x in enumerate(chunk):
            src[i, : len(x)] = torch.tensor(x, dtype=torch.long)
        if method == "greedy":
            out = greedy_decode(model, src, max_len)
        elif method == "beam":
            out = beam_search(model, src, beam_size, max_len, length_penalty)
        else:
            out = sample_decode(model, src, max_len, temperature, top_k, generator)
        results += [" ".join(tgt_vocab.decode(seq)) for seq in ids_to_lists(out)]
    return results[0] if single else results


def _report_unknown(unknown: dict[str, list[str]], n_sentences: int, on_unknown: str) -> None:
    words = list(dict.fromkeys(w for ws in unknown.values() for w in ws))  # 按出现顺序、去重
    first, first_words = next(iter(unknown.items()))
    where = f"{len(unknown)}/{n_sentences} 句，如 {first!r} 中的 {first_words}" if n_sentences > 1 else repr(first)
    text = f"sentences 里有词表外的词 {words}（{where}），它们只能当作 <unk>，译文多半不可信"
    report_unknown(text, on_unknown, stacklevel=3)
