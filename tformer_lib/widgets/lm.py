"""第 9 章的采样探索器：温度（temperature）、top-k、top-p 怎样改变下一个字的分布，以及采出来的诗。

网页上（没有内核）拖动的是一个“采样设置”滑块（:data:`SAMPLING_SETTINGS` 各档，温度、top-k、top-p
三种旋钮都在其中），每档预先画好一帧；Jupyter 里它实时重画。每一帧都用同一个种子采样，
所以不同帧之间的差别只来自采样设置。
"""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as widgets
import torch

from tformer_lib.widgets.base import Explorer

__all__ = ["SAMPLING_SETTINGS", "sampling_frame", "sampling_explorer"]

#: (说明, 温度, top_k, top_p)：网页上能切换的各档
SAMPLING_SETTINGS: tuple[tuple[str, float, int | None, float | None], ...] = (
    ("贪心 (T→0)", 0.05, None, None),
    ("T = 0.5", 0.5, None, None),
    ("T = 0.8", 0.8, None, None),
    ("T = 1.0", 1.0, None, None),
    ("T = 1.5", 1.5, None, None),
    ("T = 1.0, top-k = 5", 1.0, 5, None),
    ("T = 1.0, top-p = 0.5", 1.0, None, 0.5),
    ("T = 1.5, top-p = 0.9", 1.5, None, 0.9),
)


@torch.no_grad()
def sampling_frame(model, tokenizer, prompt: str, setting: int, *, n_show: int = 12, seed: int = 0):
    """第 ``setting`` 档设置下的图（:func:`~tformer_lib.plotting.lm.plot_sampling`）：提示之后下一个字的分布，和一首采样出的诗。"""
    from tformer_lib.lm.generate import generate, next_token_distribution
    from tformer_lib.plotting.lm import plot_sampling
    from tformer_lib.specials import BOS, EOS, PAD, UNK

    name, temperature, top_k, top_p = SAMPLING_SETTINGS[setting]
    ids = torch.tensor([[BOS] + tokenizer.encode(prompt)])  # (1, T)
    logits = model(ids)[:, -1]  # (1, V)
    suppress = (PAD, BOS, UNK)
    before = next_token_distribution(logits, 1.0, None, None, suppress)[0]  # (V,)
    after = next_token_distribution(logits, temperature, top_k, top_p, suppress)[0]  # (V,)
    top = before.topk(n_show).indices
    labels = [tokenizer.decode([int(i)]) or "·" for i in top]
    new = generate(model, ids[0], min(80, model.config.max_len - ids.shape[1]), temperature=temperature,
                   top_k=top_k, top_p=top_p, generator=torch.Generator().manual_seed(seed), eos_id=EOS,
                   suppress_ids=suppress)
    poem = tokenizer.decode(new.tolist())
    return plot_sampling(before[top], after[top], labels, poem=poem,
                         title=f"{name}：「{prompt}」之后的下一个字（原始概率最高的 {n_show} 个候选）")


def sampling_explorer(model, tokenizer, prompt: str, setting: int = 2, *, seed: int = 0,
                      settings: Sequence[int] | None = None) -> Explorer:
    """采样探索器：一个“采样设置”滑块（网页上也能拖动），图见 :func:`sampling_frame`。"""
    idx = list(range(len(SAMPLING_SETTINGS))) if settings is None else list(settings)
    if setting not in idx:
        setting = idx[0]
    control = widgets.SelectionSlider(options=[(SAMPLING_SETTINGS[i][0], i) for i in idx], value=setting,
                                      description="采样设置", continuous_update=False,
                                      style={"description_width": "initial"}, layout={"width": "520px"})

    def _plot(setting):
        return sampling_frame(model, tokenizer, prompt, setting, seed=seed)

    _plot.__name__ = "sampling_frame"
    return Explorer(_plot, {"setting": control}, {}, title="采样探索器：温度 / top-k / top-p", static="setting")
