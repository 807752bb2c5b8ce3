"""坏输入给出清楚的错误：每个公开入口对每类坏输入抛出约定的异常类型，消息点名出错的参数。

每个用例是 ``(名字, 调用, 异常类型, 正则)``；正则必须匹配消息里的参数名（以及收到的值或形状），
这样「错误点名参数」是被测试的，而不只是碰巧抛了个异常。用例按层排列：模型部件 → 模型 → 解码 →
损失 → 数据 → 检查点 → 命令行。
"""

from __future__ import annotations

import math

import pytest
import torch

from tformer_lib import TransformerConfig, make_model
from tformer_lib.parts.attention import MultiHeadAttention, scaled_dot_product_attention
from tformer_lib.commands.cli import main as cli_main
from tformer_lib.data import Vocab, batch_iterator, make_batch, make_copy_task, make_toy_corpus, pad_sequences
from tformer_lib.data import make_synthetic_splits, tokenize_zh
from tformer_lib.translation.decoding import beam_search, greedy_decode, sample_decode, translate
from tformer_lib.parts.embedding import TokenEmbedding
from tformer_lib.parts.feedforward import PositionwiseFeedForward
from tformer_lib.parts.kv_cache import KVCache
from tformer_lib.parts.masks import causal_mask, combine_masks, padding_mask
from tformer_lib.parts.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from tformer_lib.training import (
    CheckpointError,
    LabelSmoothingLoss,
    Trainer,
    label_smoothing_loss,
    load_checkpoint,
    load_model,
    save_checkpoint,
)

V_SRC, V_TGT = 30, 25


def _config(**kw):
    base = dict(d_model=16, n_heads=4, d_ff=32, n_encoder_layers=1, n_decoder_layers=2, dropout=0.0, max_len=20)
    return TransformerConfig(V_SRC, V_TGT, **{**base, **kw})


_MODEL = None


def model():
    global _MODEL
    if _MODEL is None:
        torch.manual_seed(0)
        _MODEL = make_model(_config()).eval()
    return _MODEL


def src(B=2, S=5):
    return torch.randint(4, V_SRC, (B, S), generator=torch.Generator().manual_seed(B * 10 + S))


def tgt(B=2, T=4):
    return torch.randint(4, V_TGT, (B, T), generator=torch.Generator().manual_seed(B * 10 + T + 1))


x16 = torch.randn(2, 5, 16)
mha = MultiHeadAttention(16, 4)
vocab = Vocab(["狗", "咬", "人"])

CASES = [
    # ---- 模型部件 -------------------------------------------------------------------------------------
    ("mha_dropout_one", lambda: MultiHeadAttention(16, 4, dropout=1.0), ValueError, r"dropout 应是 \[0, 1\) 内的数，收到 1\.0"),
    ("mha_fast_string", lambda: MultiHeadAttention(16, 4, fast="no"), TypeError, r"fast 应是 True 或 False，收到 str 'no'"),
    ("mha_heads_divide", lambda: MultiHeadAttention(10, 3), ValueError, r"d_model=10 不能被 n_heads=3 整除"),
    ("mha_batch_mismatch", lambda: mha(x16, torch.randn(3, 5, 16), torch.randn(3, 5, 16)), ValueError,
     r"query 的批大小是 2，key 的批大小是 3"),
    ("mha_float64_input", lambda: mha(x16.double(), x16.double(), x16.double()), TypeError,
     r"query 的 dtype 是 torch\.float64.*参数是 torch\.float32"),
    ("mha_key_dtype", lambda: mha(x16, x16.double(), x16), TypeError, r"query 的 dtype 是 torch\.float32，key 的 dtype 是 torch\.float64"),
    ("mha_key_value_len", lambda: mha(x16, x16, x16[:, :3]), ValueError, r"key 与 value 的 \(B, T_k\) 应相同"),
    ("mha_mask_not_bool", lambda: mha(x16, x16, x16, torch.ones(5, 5)), TypeError, r"mask 的 dtype 应是 torch\.bool"),
    ("sdpa_dtype", lambda: scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(2, 3, 4).double(),
                                                       torch.randn(2, 3, 4)), TypeError, r"q 的 dtype 是 torch\.float32，k 的 dtype"),
    ("sdpa_batch", lambda: scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(3, 3, 4), torch.randn(3, 3, 4)),
     ValueError, r"q 与 k 的批维度.*无法对齐"),
    ("sinusoidal_d_model", lambda: SinusoidalPositionalEncoding(32, 10)(x16), ValueError,
     r"x 的最后一维是 16，但这个位置编码模块的 d_model=32"),
    ("learned_d_model", lambda: LearnedPositionalEmbedding(8, 10)(x16), ValueError, r"x 的最后一维是 16.*d_model=8"),
    ("pe_too_long", lambda: SinusoidalPositionalEncoding(16, 4)(x16), ValueError, r"x 的长度 5 从位置 0 开始，超出了位置编码的 max_len=4"),
    ("pe_dropout", lambda: SinusoidalPositionalEncoding(16, 10, dropout=1.0), ValueError, r"dropout 应是 \[0, 1\)"),
    ("ffn_dropout", lambda: PositionwiseFeedForward(16, 32, dropout=1.0), ValueError, r"dropout 应是 \[0, 1\)"),
    ("ffn_float64", lambda: PositionwiseFeedForward(16, 32)(x16.double()), TypeError, r"x 的 dtype 是 torch\.float64"),
    ("embedding_id", lambda: TokenEmbedding(10, 4)(torch.tensor([[3, 10]])), ValueError, r"tokens 中的词元 id 落在 \[3, 10\]"),
    ("causal_mask_n", lambda: causal_mask(0), ValueError, r"n 应是正整数，收到 0"),
    ("padding_mask_dim", lambda: padding_mask(torch.tensor([1, 2])), ValueError, r"tokens 应是 2 维张量"),
    ("combine_masks_dtype", lambda: combine_masks(torch.ones(2, 2)), TypeError, r"masks 里的每个掩码都应是 torch\.bool"),
    # ---- 配置与模型 -------------------------------------------------------------------------------------
    ("config_fast_string", lambda: _config(fast_attention="no"), TypeError, r"fast_attention 应是 True 或 False，收到 str 'no'"),
    ("config_norm_first_int", lambda: _config(norm_first=1), TypeError, r"norm_first 应是 True 或 False"),
    ("config_dropout", lambda: _config(dropout=1.0), ValueError, r"dropout 应是 \[0, 1\) 内的数，收到 1\.0"),
    ("config_heads", lambda: _config(d_model=510, n_heads=8), ValueError, r"d_model=510 不能被 n_heads=8 整除"),
    ("config_positional", lambda: _config(positional="rotary"), ValueError, r"positional 应是 .* 之一，收到 'rotary'"),
    ("model_batch_1_vs_3", lambda: model()(src(1), tgt(3)), ValueError, r"src 的批大小是 1，tgt_in 的批大小是 3"),
    ("model_batch_2_vs_3", lambda: model()(src(2), tgt(3)), ValueError, r"src 的批大小是 2，tgt_in 的批大小是 3"),
    ("model_src_id", lambda: model()(torch.tensor([[4, 30]]), tgt(1)), ValueError, r"src 中的词元 id 落在 \[4, 30\]，超出了词表范围 \[0, 29\]"),
    ("model_tgt_in_id", lambda: model()(src(1), torch.tensor([[1, 25]])), ValueError, r"tgt_in 中的词元 id 落在 \[1, 25\].*\[0, 24\]"),
    ("model_src_float", lambda: model()(src().float(), tgt()), TypeError, r"src 应是整数类型的词元 id"),
    ("model_src_1d", lambda: model()(src()[0], tgt()), ValueError, r"src 应是 2 维张量"),
    ("model_src_mask", lambda: model().encode(src(), torch.ones(2, 1, 1, 4, dtype=torch.bool)), ValueError,
     r"src_mask 的形状 \(2, 1, 1, 4\) 无法广播"),
    ("decode_memory_batch", lambda: model().decode(torch.randn(3, 5, 16), tgt(2)), ValueError,
     r"tgt_in 的批大小是 2，memory 的批大小是 3"),
    ("decode_memory_d_model", lambda: model().decode(torch.randn(2, 5, 8), tgt(2)), ValueError, r"memory 的最后一维是 8.*d_model=16"),
    ("decode_cache_layers", lambda: model().decode(model().encode(src()), tgt(2, 1), cache=KVCache(1)), ValueError,
     r"cache 有 1 层，但解码器有 2 层"),
    ("decode_cache_type", lambda: model().decode(model().encode(src()), tgt(2, 1), cache={}), TypeError, r"cache 应是 model\.new_cache\(\)"),
    ("set_fast_string", lambda: make_model(_config()).set_fast_attention("no"), TypeError, r"fast 应是 True 或 False"),
    # ---- 解码 -------------------------------------------------------------------------------------------
    ("beam_empty_batch", lambda: beam_search(model(), src()[:0]), ValueError, r"src 是空批次（形状 \(0, 5\)）"),
    ("greedy_empty_batch", lambda: greedy_decode(model(), src()[:0]), ValueError, r"src 是空批次"),
    ("greedy_max_len_too_big", lambda: greedy_decode(model(), src(), max_len=21), ValueError, r"max_len=21 超过了.*config\.max_len=20"),
    ("beam_size_zero", lambda: beam_search(model(), src(), beam_size=0), ValueError, r"beam_size 应为正整数，收到 0"),
    ("sample_temperature_inf", lambda: sample_decode(model(), src(), temperature=math.inf), ValueError,
     r"temperature 应是 ≥ 0 的有限数（0 表示贪心），收到 inf"),
    ("sample_temperature_nan", lambda: sample_decode(model(), src(), temperature=float("nan")), ValueError, r"temperature .*nan"),
    ("sample_top_k_true", lambda: sample_decode(model(), src(), top_k=True), ValueError, r"top_k 应是整数，收到 bool True"),
    ("translate_batch_size_zero", lambda: translate(model(), "狗 咬 人", vocab, vocab, batch_size=0), ValueError,
     r"batch_size 应是正整数，收到 0"),
    ("translate_method", lambda: translate(model(), "狗", vocab, vocab, method="topp"), ValueError, r"method 应为 .*收到 'topp'"),
    ("translate_sentence_type", lambda: translate(model(), ["狗", 3], vocab, vocab), TypeError, r"sentences\[1\] 应是字符串"),
    # ---- 损失 -------------------------------------------------------------------------------------------
    ("loss_target_ge_V", lambda: label_smoothing_loss(torch.randn(2, 3, 7), torch.tensor([[1, 2, 7], [0, 0, 0]])), ValueError,
     r"target 中的词元 id 落在 \[1, 7\]，超出了词表范围 \[0, 6\]"),
    ("loss_target_negative", lambda: label_smoothing_loss(torch.randn(2, 7), torch.tensor([-1, 2])), ValueError, r"target 中的词元 id"),
    ("loss_target_float", lambda: label_smoothing_loss(torch.randn(2, 7), torch.tensor([1.0, 2.0])), TypeError, r"target 应是整数类型"),
    ("loss_shape", lambda: label_smoothing_loss(torch.randn(2, 3, 7), torch.zeros(2, 4, dtype=torch.long)), ValueError,
     r"logits 的形状 \(2, 3, 7\).*target 的形状 \(2, 4\)"),
    ("loss_reduction_at_construction", lambda: LabelSmoothingLoss(0.1, reduction="avg"), ValueError,
     r"reduction 应是 'mean'、'sum'、'none' 之一，收到 'avg'"),
    ("loss_smoothing", lambda: LabelSmoothingLoss(1.0), ValueError, r"smoothing 应在 \[0, 1\) 内，收到 1\.0"),
    ("loss_smoothing_string", lambda: label_smoothing_loss(torch.randn(2, 7), torch.tensor([1, 2]), "0.1"), ValueError,
     r"smoothing 应在 \[0, 1\) 内，收到 '0\.1'"),
    ("trainer_smoothing", lambda: Trainer(model(), [([4], [4])], label_smoothing=1.5), ValueError, r"smoothing 应在 \[0, 1\)"),
    ("trainer_batch_size", lambda: Trainer(model(), [([4], [4])], batch_size=0), ValueError, r"batch_size 应为正整数，收到 0"),
    # ---- 数据 -------------------------------------------------------------------------------------------
    ("vocab_duplicate", lambda: Vocab(["a", "a"]), ValueError, r"tokens 中有重复词元"),
    ("vocab_encode_string", lambda: vocab.encode("狗咬人"), TypeError, r"tokens 应是词元列表"),
    ("vocab_token_index", lambda: vocab.token(99), ValueError, r"index=99 超出词表范围"),
    ("make_batch_empty", lambda: make_batch([]), ValueError, r"pairs 为空"),
    ("make_batch_empty_source", lambda: make_batch([([], [4])]), ValueError, r"pairs\[0\] 的源句为空"),
    ("pad_sequences_empty", lambda: pad_sequences([]), ValueError, r"seqs 为空"),
    ("batch_iterator_zero", lambda: list(batch_iterator([([4], [4])], 0)), ValueError, r"batch_size 应为 ≥1 的整数，收到 0"),
    ("copy_task_min_len", lambda: make_copy_task(5, min_len=0), ValueError, r"min_len=0"),
    ("synthetic_task", lambda: make_synthetic_splits("sort"), ValueError, r"task 应为 'copy' 或 'reverse'，收到 'sort'"),
    ("toy_corpus_negative", lambda: make_toy_corpus(n_train=-1), ValueError, r"n_train 应为 ≥0 的整数"),
    ("tokenize_zh_type", lambda: tokenize_zh(3), TypeError, r"text 应是 str"),
]


@pytest.mark.parametrize("call, error, pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_names_the_argument(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


# ---- 检查点 ------------------------------------------------------------------------------------------------

def _saved(tmp_path, name="m.pt", **kw):
    return save_checkpoint(tmp_path / name, model(), Vocab([f"s{i}" for i in range(V_SRC - 4)]),
                           Vocab([f"t{i}" for i in range(V_TGT - 4)]), **kw)


def _tamper(path, **changes):
    data = torch.load(path, weights_only=True)
    for key, value in changes.items():
        data[key] = value
    torch.save(data, path)
    return path


CHECKPOINT_CASES = [
    ("missing_file", lambda p: load_checkpoint(p / "nope.pt"), FileNotFoundError, r"找不到检查点文件 '.*nope\.pt'"),
    ("directory", lambda p: load_checkpoint(p), CheckpointError, r"是目录，不是检查点文件"),
    ("corrupt", lambda p: (p / "bad.pt").write_bytes(b"\x00garbage") and load_checkpoint(p / "bad.pt"), CheckpointError,
     r"无法读取检查点 '.*bad\.pt'.*损坏"),
    ("not_ours", lambda p: torch.save({"a": 1}, p / "x.pt") or load_checkpoint(p / "x.pt"), CheckpointError,
     r"不是 tformer 检查点"),
    ("src_vocab_size_mismatch", lambda p: load_model(_tamper(_saved(p), src_vocab=Vocab(["a"]).to_dict())), CheckpointError,
     r"src_vocab 有 5 个词元，但 config\.src_vocab_size=30"),
    ("tgt_vocab_size_mismatch", lambda p: load_model(_tamper(_saved(p), tgt_vocab=Vocab(["a", "b"]).to_dict())), CheckpointError,
     r"tgt_vocab 有 6 个词元，但 config\.tgt_vocab_size=25"),
    ("config_unknown_field", lambda p: load_model(_tamper(_saved(p), config={**_config().to_dict(), "n_layers": 3})),
     CheckpointError, r"config 无效.*n_layers"),
    ("save_into_directory", lambda p: save_checkpoint(p, model()), ValueError, r"path '.*' 是一个已存在的目录"),
    ("weights_mismatch", lambda p: load_model(_tamper(_saved(p), config={**_config(d_model=32, n_heads=4).to_dict()})),
     CheckpointError, r"config 与 model 权重不匹配.*参数形状不同（如 src_embed\.lut\.weight：检查点 \(30, 16\)，config 要求 \(30, 32\)）"),
    ("save_not_a_model", lambda p: save_checkpoint(p / "m.pt", torch.nn.Linear(2, 2)), TypeError, r"model 应是 make_model"),
    ("save_vocab_type", lambda p: save_checkpoint(p / "m.pt", model(), src_vocab=["a"]), TypeError, r"src_vocab 应是 Vocab 或 None"),
]


@pytest.mark.parametrize("call, error, pattern", [c[1:] for c in CHECKPOINT_CASES], ids=[c[0] for c in CHECKPOINT_CASES])
def test_bad_checkpoint_names_the_problem(tmp_path, call, error, pattern):
    with pytest.raises(error, match=pattern) as info:
        call(tmp_path)
    assert "\n" not in str(info.value), "错误消息应是一行"


# ---- 命令行：退出码非 0，标准错误上恰好一行，点名参数 ----------------------------------------------------------

def _cli_checkpoint(tmp_path):
    return str(_saved(tmp_path, extra={"task": "copy", "data_seed": 0}))


def _file_as_parent(tmp_path):
    (tmp_path / "afile").write_text("x")
    return str(tmp_path / "afile" / "m.pt")


CLI_CASES = [
    ("threads_zero", lambda p: ["--threads", "0", "translate", "--checkpoint", "x.pt", "a"], r"--threads 应为正整数，收到 0"),
    ("epochs_zero", lambda p: ["train", "--task", "copy", "--epochs", "0", "--out", str(p / "m.pt")], r"--epochs 应为正整数，收到 0"),
    ("out_is_directory", lambda p: ["train", "--task", "copy", "--out", str(p)], r"--out .* 是一个已存在的目录"),
    ("out_parent_is_file", lambda p: ["train", "--task", "copy", "--out", _file_as_parent(p)], r"--out .*afile.* 不是目录"),
    ("missing_checkpoint", lambda p: ["translate", "--checkpoint", str(p / "nope.pt"), "狗"], r"--checkpoint：找不到检查点文件"),
    ("beam_size_zero", lambda p: ["translate", "--checkpoint", _cli_checkpoint(p), "--beam-size", "0", "--method", "beam", "s1"],
     r"--beam-size 应为正整数，收到 0"),
    ("temperature_negative", lambda p: ["translate", "--checkpoint", _cli_checkpoint(p), "--method", "sample",
                                        "--temperature", "-1", "s1"], r"--temperature .*-1"),
    ("top_k_zero", lambda p: ["translate", "--checkpoint", _cli_checkpoint(p), "--method", "sample", "--top-k", "0", "s1"],
     r"--top-k 应为正整数，收到 0"),
    ("unknown_word_strict", lambda p: ["translate", "--checkpoint", _cli_checkpoint(p), "--strict", "s1 zzz"],
     r"错误：sentences 里有词表外的词 \['zzz'\]"),
    ("vocab_mismatch", lambda p: ["translate", "--checkpoint",
                                  str(_tamper(_saved(p), src_vocab=Vocab(["a"]).to_dict())), "a"],
     r"--checkpoint：检查点的 src_vocab 有 5 个词元"),
    ("weights_mismatch", lambda p: ["evaluate", "--checkpoint",
                                    str(_tamper(_saved(p), config=_config(d_ff=64).to_dict()))],
     r"--checkpoint：检查点里的 config 与 model 权重不匹配"),
    ("evaluate_without_task", lambda p: ["evaluate", "--checkpoint", str(_saved(p))], r"没有记录任务名"),
]


@pytest.mark.parametrize("argv", [c[1] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_errors_are_one_line_and_name_the_option(tmp_path, capsys, argv):
    pattern = dict((c[0], c[2]) for c in CLI_CASES)[next(c[0] for c in CLI_CASES if c[1] is argv)]
    code = cli_main(argv(tmp_path))
    err = capsys.readouterr().err
    assert code != 0
    assert len(err.strip().splitlines()) == 1, err
    assert __import__("re").search(pattern, err), err
