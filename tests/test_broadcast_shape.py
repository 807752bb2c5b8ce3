"""_checks.broadcast_shape 与 torch.broadcast_shapes 在随机形状上一致（它替代后者，因为后者每次调用要约 1 ms）。"""

import random

import torch

from tformer_lib._checks import broadcast_shape


def test_broadcast_shape_matches_torch_on_random_shapes():
    rng = random.Random(0)
    for _ in range(2000):
        shapes = [tuple(rng.choice([1, 2, 3]) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(1, 3))]
        try:
            expected = tuple(torch.broadcast_shapes(*shapes))
        except RuntimeError:
            expected = None
        assert broadcast_shape(*shapes) == expected, shapes
