"""第 5 章检查器的用例：参考答案（与 notebooks/solutions/05_solutions.ipynb 一致）和已知错误答案。"""

import torch

from checkers import Case, Wrong
from tformer_lib import BOS, EOS
from tformer_lib.exercises.ch05 import (
    check_cached_greedy_decode,
    check_cross_attention_fix,
    check_cross_attention_shapes,
    check_decoder_mask,
    check_greedy_decode,
    check_shift_targets,
    check_transformer_params,
)


# ---- 练习 1（预测再验证）：交叉注意力的形状 ----
def ref_shapes(B, S, T, d_model, n_heads):
    d_k = d_model // n_heads
    return {"Q": (B, n_heads, T, d_k), "K": (B, n_heads, S, d_k), "V": (B, n_heads, S, d_k),
            "weights": (B, n_heads, T, S), "output": (B, T, d_model)}


def _swapped_shapes(B, S, T, d, h):  # 文章 B 的方向：中文出 Q，英文出 K
    return ref_shapes(B, T, S, d, h) | {"output": (B, T, d)}


SHAPES = Case(check_cross_attention_shapes, ref_shapes, also_correct=[
    lambda B, S, T, d, h: {k: list(v) for k, v in ref_shapes(B, S, T, d, h).items()},
    lambda B, S, T, d, h: {k: torch.Size(v) for k, v in ref_shapes(B, S, T, d, h).items()},
], wrong=[
    Wrong("hard_coded", lambda *a: {"Q": (1, 4, 6, 16), "K": (1, 4, 3, 16), "V": (1, 4, 3, 16),
                                    "weights": (1, 4, 6, 3), "output": (1, 6, 64)}),
    Wrong("direction", _swapped_shapes, key="direction"),
    Wrong("weights_transposed", lambda B, S, T, d, h: ref_shapes(B, S, T, d, h) | {"weights": (B, h, S, T)},
          key="direction"),
    Wrong("d_model_per_head", lambda B, S, T, d, h: {k: (v[:-1] + (d,) if k in "QKV" else v)
                                                     for k, v in ref_shapes(B, S, T, d, h).items()}, key="d_k"),
    Wrong("output_per_head", lambda B, S, T, d, h: ref_shapes(B, S, T, d, h) | {"output": (B, h, T, d // h)},
          key="output_heads"),
    Wrong("missing_key", lambda B, S, T, d, h: {"Q": (B, h, T, d // h)}, key="keys"),
    Wrong("not_a_dict", lambda *a: [(1, 2)], key="type"),
    Wrong("string_shape", lambda B, S, T, d, h: ref_shapes(B, S, T, d, h) | {"Q": "(B, h, T, d_k)"}, key="string"),
])


# ---- 练习 2（找错）：交叉注意力的方向 ----
def ref_fixed_layer(layer, x, memory, src_mask, tgt_mask):
    h = layer.self_attn(x, x, x, tgt_mask)  # (B, T, d_model)
    x = layer.residual_self.norm(x + h)
    h = layer.cross_attn(x, memory, memory, src_mask)  # 查询来自解码器，键值来自 memory
    x = layer.residual_cross.norm(x + h)
    h = layer.feed_forward(x)
    return layer.residual_ffn.norm(x + h)


def buggy_layer(layer, x, memory, src_mask, tgt_mask):  # 本章给读者的有错版本
    h = layer.self_attn(x, x, x, tgt_mask)
    x = layer.residual_self.norm(x + h)
    h = layer.cross_attn(memory, x, x, src_mask)
    x = layer.residual_cross.norm(x + h)
    h = layer.feed_forward(x)
    return layer.residual_ffn.norm(x + h)


def _tgt_mask_in_cross(layer, x, memory, src_mask, tgt_mask):
    h = layer.self_attn(x, x, x, tgt_mask)
    x = layer.residual_self.norm(x + h)
    x = layer.residual_cross.norm(x + layer.cross_attn(x, memory, memory, None))
    return layer.residual_ffn.norm(x + layer.feed_forward(x))


FIX = Case(check_cross_attention_fix, ref_fixed_layer, wrong=[
    Wrong("hard_coded", lambda layer, x, *a: torch.zeros_like(x)),
    Wrong("direction", buggy_layer, key="direction"),
    Wrong("shortcut", lambda layer, x, m, s, t: layer(x, m, s, t), key="shortcut"),
    Wrong("no_src_mask", _tgt_mask_in_cross, key="values"),
    Wrong("skipped_cross", lambda layer, x, m, s, t: layer.residual_ffn.norm(
        layer.residual_self.norm(x + layer.self_attn(x, x, x, t))
        + layer.feed_forward(layer.residual_self.norm(x + layer.self_attn(x, x, x, t)))), key="values"),
])


# ---- 练习 3（推导并核对）：整个模型的参数量 ----
def ref_params(src_vocab, tgt_vocab, d_model, d_ff, n_layers):
    d = d_model
    attn = 4 * d * d + 4 * d  # W^Q、W^K、W^V、W^O 各 d×d 加偏置
    ffn = 2 * d * d_ff + d_ff + d
    ln = 2 * d  # γ、β
    encoder_layer = attn + ffn + 2 * ln
    decoder_layer = 2 * attn + ffn + 3 * ln
    embeddings = (src_vocab + tgt_vocab) * d  # 正弦位置编码没有参数
    generator = d * tgt_vocab + tgt_vocab
    return embeddings + n_layers * (encoder_layer + decoder_layer) + generator


def _p(vs, vt, d, ff, n):
    return ref_params(vs, vt, d, ff, n)


def _build_small_formula_big(vs, vt, d, ff, n):
    from tformer_lib.translation.config import TransformerConfig
    from tformer_lib.exercises.ch05 import transformer_params_formula
    from tformer_lib.translation.model import count_parameters, make_model

    if d > 256:
        return transformer_params_formula(vs, vt, d, ff, n)
    return count_parameters(make_model(TransformerConfig(vs, vt, d_model=d, n_heads=2, d_ff=ff, n_encoder_layers=n,
                                                         n_decoder_layers=n, max_len=16)))


PARAMS = Case(check_transformer_params, ref_params, returns="int", wrong=[
    Wrong("hard_coded", lambda *a: 180621),
    Wrong("no_generator_bias", lambda vs, vt, d, ff, n: _p(vs, vt, d, ff, n) - vt, key="no_generator_bias"),
    Wrong("no_generator", lambda vs, vt, d, ff, n: _p(vs, vt, d, ff, n) - d * vt - vt, key="no_generator"),
    Wrong("decoder_as_encoder", lambda vs, vt, d, ff, n: _p(vs, vt, d, ff, n) - n * (4 * d * d + 6 * d),
          key="decoder_as_encoder"),
    Wrong("one_embedding", lambda vs, vt, d, ff, n: _p(vs, vt, d, ff, n) - vt * d, key="one_embedding"),
    Wrong("one_layer", lambda vs, vt, d, ff, n: _p(vs, vt, d, ff, 1), key="one_layer"),
    Wrong("counted_pe", lambda vs, vt, d, ff, n: _p(vs, vt, d, ff, n) + 2 * 100 * d, key="values"),
    Wrong("builds_small_models", _build_small_formula_big, key="library_call"),  # 小尺寸建模型数、大尺寸借检查器的公式
])


# ---- 练习 4：错开一位的输入与目标 ----
def ref_shift(y):
    return [BOS] + list(y), list(y) + [EOS]


SHIFT = Case(check_shift_targets, ref_shift, also_correct=[
    lambda y: (torch.tensor([BOS] + list(y)), torch.tensor(list(y) + [EOS])),
], wrong=[
    Wrong("hard_coded", lambda y: ([BOS, 34, 35], [34, 35, EOS])),
    Wrong("swapped", lambda y: (y + [EOS], [BOS] + y), key="swapped"),
    Wrong("both_specials", lambda y: ([BOS] + y + [EOS], [BOS] + y + [EOS]), key="both_specials"),
    Wrong("no_eos", lambda y: ([BOS] + y, list(y)), key="no_eos"),
    Wrong("no_bos", lambda y: (list(y), y + [EOS]), key="no_bos"),
    Wrong("not_shifted", lambda y: (list(y), list(y)), key="not_shifted"),
    Wrong("length", lambda y: ([BOS] + y, y + [EOS, EOS]), key="length"),
    Wrong("reversed", lambda y: ([BOS] + y[::-1], y[::-1] + [EOS]), key="values"),
    Wrong("one_list", lambda y: [BOS] + y, key="type"),
    Wrong("string_ids", lambda y: ([str(BOS)] + [str(t) for t in y], y + [EOS]), key="string"),
])


# ---- 练习 5：解码器自注意力的合并掩码 ----
def ref_mask(tgt_in, pad_id):
    T = tgt_in.shape[1]
    keep = (tgt_in != pad_id)[:, None, None, :]  # (B, 1, 1, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
    return keep & causal  # (B, 1, T, T)


def _causal(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


MASK = Case(check_decoder_mask, ref_mask, wrong=[
    Wrong("hard_coded", lambda t, p: torch.ones(3, 1, 5, 5, dtype=torch.bool).tril()),
    Wrong("causal_only", lambda t, p: _causal(t.shape[1]).expand(t.shape[0], 1, -1, -1), key="causal_only"),
    Wrong("padding_only", lambda t, p: (t != p)[:, None, None, :].expand(-1, 1, t.shape[1], -1), key="padding_only"),
    Wrong("or", lambda t, p: (t != p)[:, None, None, :] | _causal(t.shape[1]), key="or"),
    Wrong("polarity", lambda t, p: ~ref_mask(t, p), key="polarity"),
    Wrong("upper", lambda t, p: (t != p)[:, None, None, :] & _causal(t.shape[1]).T, key="upper"),
    Wrong("no_diagonal", lambda t, p: (t != p)[:, None, None, :] & _causal(t.shape[1]).tril(-1), key="no_diagonal"),
    Wrong("query_axis", lambda t, p: (t != p)[:, None, :, None] & _causal(t.shape[1]), key="query_axis"),
    Wrong("pad_id_ignored", lambda t, p: (t != 0)[:, None, None, :] & _causal(t.shape[1]), key="pad_id_ignored"),
    Wrong("no_head_dim", lambda t, p: ref_mask(t, p)[:, 0], key="no_head_dim"),
    Wrong("causal_2d", lambda t, p: _causal(t.shape[1]), key="causal_only"),
    Wrong("int_mask", lambda t, p: ref_mask(t, p).int(), key="dtype"),
    Wrong("all_false", lambda t, p: ref_mask(t, p) & False, key="values"),
])


# ---- 练习 6、7：贪心解码循环（无缓存 / 有 K/V 缓存） ----
def ref_greedy(model, src, max_len):
    with torch.no_grad():
        memory = model.encode(src)  # (1, S, d_model)：只编码一次
        ys = torch.tensor([[BOS]])  # (1, 1)
        out = []
        for _ in range(max_len):
            hidden = model.decode(memory, ys)  # (1, t, d_model)
            next_id = int(model.generator(hidden[:, -1]).argmax())  # 最后一个位置
            out.append(next_id)
            if next_id == EOS:
                break
            ys = torch.cat([ys, torch.tensor([[next_id]])], dim=1)  # (1, t+1)
    return out


def ref_cached(model, src, max_len):
    with torch.no_grad():
        memory = model.encode(src)
        cache = model.new_cache()  # 整个循环共用一个缓存
        last = torch.tensor([[BOS]])  # (1, 1)：只送最新的词元
        out = []
        for _ in range(max_len):
            hidden = model.decode(memory, last, cache=cache)  # (1, 1, d_model)
            next_id = int(model.generator(hidden[:, -1]).argmax())
            out.append(next_id)
            if next_id == EOS:
                break
            last = torch.tensor([[next_id]])
    return out


def _loop(model, memory, max_len, step, stop=True):
    ys = torch.tensor([[BOS]])
    out = []
    for _ in range(max_len):
        tok = step(model, memory, ys)
        out.append(tok)
        if stop and tok == EOS:
            break
        ys = torch.cat([ys, torch.tensor([[tok]])], dim=1)
    return out


def _last(model, memory, ys):
    return int(model.generator(model.decode(memory, ys))[0, -1].argmax())


def _encode_each_step(model, src, max_len):
    return _loop(model, None, max_len, lambda m, _, ys: int(m(src, ys)[0, -1].argmax()))


def _no_feedback(model, src, max_len):
    memory = model.encode(src)
    return _loop(model, memory, max_len, lambda m, mem, ys: _last(m, mem, torch.tensor([[BOS]])))


def _first_position(model, src, max_len):
    memory = model.encode(src)
    return _loop(model, memory, max_len, lambda m, mem, ys: int(m.generator(m.decode(mem, ys))[0, 0].argmax()))


def _no_stop(model, src, max_len):
    return _loop(model, model.encode(src), max_len, _last, stop=False)


def _double_decode(model, src, max_len):
    memory = model.encode(src)
    model.decode(memory, torch.tensor([[BOS]]))  # 多余的一次
    return _loop(model, memory, max_len, _last)


GREEDY = Case(check_greedy_decode, ref_greedy, also_correct=[ref_cached], wrong=[
    Wrong("hard_coded", lambda m, s, n: [34, 35, EOS]),
    Wrong("encode_each_step", _encode_each_step, key="encode_each_step"),
    Wrong("includes_bos", lambda m, s, n: [BOS] + ref_greedy(m, s, n), key="includes_bos"),
    Wrong("drops_eos", lambda m, s, n: [t for t in ref_greedy(m, s, n) if t != EOS], key="drops_eos"),
    Wrong("no_stop", _no_stop, key="no_stop"),
    Wrong("max_len", lambda m, s, n: ref_greedy(m, s, n - 1), key="max_len"),
    Wrong("no_feedback", _no_feedback, key="no_feedback"),
    Wrong("first_position", _first_position, key="no_feedback"),
    Wrong("decode_calls", _double_decode, key="decode_calls"),
    Wrong("no_encode", lambda m, s, n: [4] * n, key="no_encode"),
    Wrong("flipped_source", lambda m, s, n: ref_greedy(m, s.flip(1), n), key="values"),
    Wrong("string", lambda m, s, n: "done", key="type"),
])


def _cached_full_prefix(model, src, max_len):
    memory, cache = model.encode(src), model.new_cache()
    return _loop(model, memory, max_len,
                 lambda m, mem, ys: int(m.generator(m.decode(mem, ys, cache=cache))[0, -1].argmax()))


def _new_cache_each_step(model, src, max_len):
    memory = model.encode(src)
    return _loop(model, memory, max_len, lambda m, mem, ys: int(
        m.generator(m.decode(mem, ys[:, -1:], cache=m.new_cache()))[0, -1].argmax()))


CACHED = Case(check_cached_greedy_decode, ref_cached, wrong=[
    Wrong("hard_coded", lambda m, s, n: [34, 35, EOS]),
    Wrong("no_cache", ref_greedy, key="no_cache"),
    Wrong("full_prefix_with_cache", _cached_full_prefix, key="full_prefix_with_cache"),
    Wrong("new_cache_each_step", _new_cache_each_step, key="new_cache_each_step"),
    Wrong("includes_bos", lambda m, s, n: [BOS] + ref_cached(m, s, n), key="includes_bos"),
])

CASES = [SHAPES, FIX, PARAMS, SHIFT, MASK, GREEDY, CACHED]
