"""通信量与 ZeRO 的公式：坏参数用中文点名报错（否则 "10" × 4 = "10101010"、stages=0 得到负字节），NumPy 整数照收。"""

import numpy as np
import pytest
import torch

from tformer_lib.parallel.comm import (
    RECORD_OPS,
    data_parallel_payload,
    pipeline_payload,
    record,
    recording,
    ring_all_reduce_bytes,
    tensor_parallel_payload,
)
from tformer_lib.parallel.zero import zero_bytes_per_rank


def test_formulas_keep_their_values_and_accept_numpy_integers():
    assert data_parallel_payload(10) == 40 and data_parallel_payload(np.int64(10), 2) == 20
    assert tensor_parallel_payload(2, 3, 4) == 384 and tensor_parallel_payload(2, 3, 4, input_requires_grad=False) == 288
    assert pipeline_payload(2, 3, 4) == 192 and pipeline_payload(2, 3, 4, stages=1) == 0
    assert ring_all_reduce_bytes(100, 4) == 150 and ring_all_reduce_bytes(100, np.int64(1)) == 0
    assert zero_bytes_per_rank(np.int64(1000), np.int64(4), np.int64(2))["total"] == 4 * 1000 + 12 * 1000 / 4


@pytest.mark.parametrize("call, error, match", [
    (lambda: data_parallel_payload("10"), TypeError, "n_params 应是整数，收到 str '10'"),
    (lambda: data_parallel_payload(10, 0), ValueError, "element_bytes 应是正整数"),
    (lambda: data_parallel_payload(True), TypeError, "n_params 应是整数，收到 bool"),
    (lambda: pipeline_payload(2, 3, 4, stages=0), ValueError, "stages 应是正整数，收到 0"),
    (lambda: tensor_parallel_payload(2, -3, 4), ValueError, "length 应是正整数，收到 -3"),
    (lambda: tensor_parallel_payload(2, 3, 4, n_blocks=0), ValueError, "n_blocks"),
    (lambda: tensor_parallel_payload(2, 3, 4, input_requires_grad="no"), TypeError, "input_requires_grad 应是 True 或 False"),
    (lambda: ring_all_reduce_bytes(-1, 2), ValueError, "payload_bytes 应是 ≥ 0 的有限字节数，收到 -1"),
    (lambda: ring_all_reduce_bytes(float("nan"), 2), ValueError, "payload_bytes"),
    (lambda: ring_all_reduce_bytes("100", 2), ValueError, "payload_bytes.*'100'"),
    (lambda: ring_all_reduce_bytes(100, 0), ValueError, "world_size 应是正整数"),
    (lambda: record("blah", torch.zeros(2)), ValueError, "op 应是 'all_reduce'"),
    (lambda: record("send", [1, 2]), TypeError, "tensor 应是交给 send 的 torch.Tensor，收到 list"),
    (lambda: zero_bytes_per_rank(100, 2, True), ValueError, "stage 应是 .* 之一（整数），收到 True"),
    (lambda: zero_bytes_per_rank(100, 2, 1.0), ValueError, "stage .*收到 1.0"),
    (lambda: zero_bytes_per_rank(100, 2, 4), ValueError, "stage"),
    (lambda: zero_bytes_per_rank(100, 2, 1, param_bytes=0), ValueError, "param_bytes 应是正的有限字节数，收到 0"),
    (lambda: zero_bytes_per_rank(100, 2, 1, grad_bytes=-2), ValueError, "grad_bytes"),
    (lambda: zero_bytes_per_rank(100, 2, 1, optimizer_bytes=float("nan")), ValueError, "optimizer_bytes"),
    (lambda: zero_bytes_per_rank(100, 2, 1, param_bytes=True), ValueError, "param_bytes.*True"),
    (lambda: zero_bytes_per_rank(0, 2, 1), ValueError, "n_params 应是正整数"),
])
def test_bad_arguments_are_named_in_chinese(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_record_keeps_every_known_op_inside_recording_only():
    record("send", torch.zeros(3))  # 不在 recording 里：只检查、不记
    with recording() as sent:
        for op in RECORD_OPS:
            record(op, torch.zeros(2, dtype=torch.float64))
    assert sent == [(op, 16) for op in RECORD_OPS]


def test_hand_made_tensor_parallel_without_a_process_group_says_so_in_chinese():
    from tformer_lib import PositionwiseFeedForward
    from tformer_lib.parallel.tensor_parallel import TensorParallelFFN

    ffn = TensorParallelFFN(PositionwiseFeedForward(8, 16), 0, 1)
    with pytest.raises(RuntimeError, match="手写张量并行的 all-reduce 需要先有进程组"):
        ffn(torch.randn(2, 3, 8))
