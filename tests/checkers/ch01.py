"""第 1 章检查器的用例：参考答案（与 notebooks/solutions/01_solutions.ipynb 一致）和已知错误答案。"""

import math

import torch

from checkers import Case, Wrong
from tformer_lib import BOS, EOS, PAD, UNK
from tformer_lib.data import Vocab, make_toy_corpus, pad_sequences, tokenize_zh
from tformer_lib.exercises.ch01 import check_encode, check_mixed_cosine, check_pad_batch, check_unk_rate


# ---- 练习 1 ----
def ref_encode(tokens, stoi):
    return [BOS] + [stoi.get(t, UNK) for t in tokens] + [EOS]


ENCODE = Case(check_encode, ref_encode, also_correct=[lambda t, s: torch.tensor(ref_encode(t, s))], wrong=[
    Wrong("hard_coded", lambda t, s: [BOS, 4, 5, UNK, EOS]),
    Wrong("no_bos_eos", lambda t, s: [s.get(x, UNK) for x in t], key="no_bos_eos"),
    Wrong("no_eos", lambda t, s: [BOS] + [s.get(x, UNK) for x in t], key="no_eos"),
    Wrong("swapped", lambda t, s: [EOS] + [s.get(x, UNK) for x in t] + [BOS], key="swapped"),
    Wrong("dropped_unknown", lambda t, s: [BOS] + [s[x] for x in t if x in s] + [EOS], key="dropped_unknown"),
    Wrong("unknown_as_pad", lambda t, s: [BOS] + [s.get(x, PAD) for x in t] + [EOS], key="unknown_as_pad"),
    Wrong("key_error", lambda t, s: [BOS] + [s[x] for x in t] + [EOS], key="key_error"),
    Wrong("fixed_ids", lambda t, s: [BOS] + [4 + i for i in range(len(t))] + [EOS], key="values"),
    Wrong("string", lambda t, s: str(ref_encode(t, s)), key="string"),
])


# ---- 练习 2 ----
def ref_mixed_cosine(a, b):
    return a / math.sqrt(a * a + b * b)


MIXED = Case(check_mixed_cosine, ref_mixed_cosine, returns="number", wrong=[
    Wrong("hard_coded", lambda a, b: 0.174),
    Wrong("ratio", lambda a, b: a / b, key="ratio"),
    Wrong("sum_of_norms", lambda a, b: a / (a + b), key="sum_of_norms"),
    Wrong("swapped", lambda a, b: b / math.hypot(a, b), key="swapped"),
    Wrong("squared", lambda a, b: a * a / (a * a + b * b), key="squared"),
    Wrong("other", lambda a, b: a / math.hypot(a, 2 * b), key="values"),
])


# ---- 练习 3 ----
def ref_pad(seqs):
    t_max = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t_max), PAD, dtype=torch.long)  # (B, T_max)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s, dtype=torch.long)
    return ids, ids != PAD


def buggy_pad(seqs):  # 本章给读者的有错版本：len(max(seqs)) 是字典序最大的那句的长度
    t_max = len(max(seqs))
    ids = torch.full((len(seqs), t_max), PAD, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s, dtype=torch.long)
    return ids, ids != PAD


def left_pad(seqs):
    t = max(map(len, seqs))
    ids = torch.full((len(seqs), t), PAD, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, t - len(s):] = torch.tensor(s)
    return ids, ids != PAD


def _hard_coded_pad(seqs):
    ids = torch.tensor([[4, 5, 6, 7], [9, 8, PAD, PAD], [5, PAD, PAD, PAD]])
    return ids, ids != PAD


def _library_pad(seqs):  # 直接用库里的答案：结果对，但不算自己改对了
    ids = pad_sequences(seqs, pad_id=PAD)
    return ids, ids != PAD


PAD_CASE = Case(check_pad_batch, ref_pad, wrong=[
    Wrong("hard_coded", _hard_coded_pad),
    Wrong("calls_pad_sequences", _library_pad, key="library_call"),
    Wrong("planted_bug_len_max", buggy_pad, key="t_max"),
    Wrong("left_pad", left_pad, key="left_pad"),
    Wrong("pad_with_unk", lambda seqs: (ref_pad(seqs)[0].masked_fill(ref_pad(seqs)[0] == PAD, UNK),
                                        ref_pad(seqs)[1]), key="pad_value"),
    Wrong("polarity", lambda seqs: (ref_pad(seqs)[0], ref_pad(seqs)[0] == PAD), key="polarity"),
    Wrong("specials_masked", lambda seqs: (ref_pad(seqs)[0], ref_pad(seqs)[0] > UNK), key="specials_masked"),
    Wrong("float_ids", lambda seqs: (ref_pad(seqs)[0].float(), ref_pad(seqs)[1]), key="dtype"),
    Wrong("int_mask", lambda seqs: (ref_pad(seqs)[0], ref_pad(seqs)[1].long()), key="dtype"),
    Wrong("one_value", lambda seqs: ref_pad(seqs)[0], key="type"),
])


# ---- 练习 4 ----
_CORPUS = make_toy_corpus()


def ref_unk_rate(n_train):
    vocab = Vocab.build([tokenize_zh(zh) for zh, _ in _CORPUS.train[:n_train]])
    ids = [i for zh, _ in _CORPUS.test for i in vocab.encode(tokenize_zh(zh))]
    return sum(i == UNK for i in ids) / len(ids)


def _types_rate(n_train):
    vocab = Vocab.build([tokenize_zh(zh) for zh, _ in _CORPUS.train[:n_train]])
    types = {t for zh, _ in _CORPUS.test for t in tokenize_zh(zh)}
    return sum(t not in vocab for t in types) / len(types)


def _with_bos_eos(n_train):
    vocab = Vocab.build([tokenize_zh(zh) for zh, _ in _CORPUS.train[:n_train]])
    ids = [i for zh, _ in _CORPUS.test for i in vocab.encode(tokenize_zh(zh), add_bos=True, add_eos=True)]
    return sum(i == UNK for i in ids) / len(ids)


UNK_CASE = Case(check_unk_rate, ref_unk_rate, returns="number", wrong=[
    Wrong("hard_coded", lambda n: 0.042),
    Wrong("types", _types_rate, key="types"),
    Wrong("with_bos_eos", _with_bos_eos, key="with_bos_eos"),
    Wrong("percent", lambda n: 100 * ref_unk_rate(n), key="percent"),
    Wrong("all_train", lambda n: ref_unk_rate(len(_CORPUS.train)), key="all_train"),
    Wrong("one_more_sentence", lambda n: ref_unk_rate(n + 1), key="values"),
])

CASES = [ENCODE, MIXED, PAD_CASE, UNK_CASE]
