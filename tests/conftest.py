"""测试公共设置：单线程（2 核机器上与其他进程并行时单线程更稳）与固定种子。"""

import contextlib
import io
import os
import socket
import threading
import time

# Triton 的解释器（第 15 章的内核在 CPU 上运行）只在导入 triton 之前设置才生效；torch.compile 等别的测试
# 也会导入 triton，所以在任何测试导入它之前就设好（对 CPU 上的 Inductor 没有影响）。
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

torch.set_num_threads(1)

# 读取张量取值的检查（词元 id、位置越界）在测试里一律打开，不论张量在哪个设备上（默认只在 CPU 上做）
import tformer_lib._checks  # noqa: E402

tformer_lib._checks.CHECK_VALUES = True


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _starts_distributed(args) -> bool:
    """一条子进程命令是不是 torchrun（``torchrun …`` 或 ``python -m torch.distributed.run …``）。"""
    words = [str(a) for a in (args if isinstance(args, (list, tuple)) else str(args).split())]
    return any(w.endswith("torchrun") or w == "torch.distributed.run" for w in words)


@pytest.fixture(autouse=True)
def _distributed_mark_guard(request, monkeypatch):
    """启动进程（multiprocessing / torch.multiprocessing 的 Process、torchrun）的测试必须带 ``distributed`` 标记：
    快速一轮（``-m "not slow and not distributed"``）靠这个标记把它们排除。没带标记却启动了进程 → 测试失败。"""
    if request.node.get_closest_marker("distributed") is not None:
        yield
        return
    import multiprocessing.process
    import subprocess

    started = []
    process_start = multiprocessing.process.BaseProcess.start
    popen_init = subprocess.Popen.__init__

    def start(self, *args, **kwargs):
        started.append(f"multiprocessing 进程 {self.name}")
        return process_start(self, *args, **kwargs)

    def init(self, args, *rest, **kwargs):
        if _starts_distributed(args):
            started.append(f"torchrun（{args!r:.60}）")
        return popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    monkeypatch.setattr(subprocess.Popen, "__init__", init)
    yield
    if started:
        pytest.fail(f"这个测试启动了{started[0]}，却没有 @pytest.mark.distributed 标记（pyproject.toml 的 markers）",
                    pytrace=False)


@pytest.fixture
def tiny_model_attention():
    """一个 2+1 层的小模型跑一次前向后留下的注意力权重（画图与控件测试共用）。"""
    from tformer_lib import TransformerConfig, make_model

    torch.manual_seed(0)
    cfg = TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2, d_ff=32,
                            n_encoder_layers=2, n_decoder_layers=1, dropout=0.0)
    model = make_model(cfg).eval()
    with torch.no_grad():
        model(torch.tensor([[5, 6, 7, 8]]), torch.tensor([[1, 9, 10]]))
    return model.attention_weights()


@pytest.fixture
def render():
    """把 Figure 真正栅格化成 PNG 并返回它。

    库的图不经过 pyplot，``Figure.canvas`` 是 ``FigureCanvasBase``，它的 ``draw()`` 什么也不画；
    只有真正渲染，缺字（Glyph missing）之类的警告才会出现，配合 ``filterwarnings("error")`` 才有意义。
    """

    def _render(fig):
        fig.savefig(io.BytesIO(), format="png", dpi=40)
        return fig

    return _render


@contextlib.contextmanager
def _serve_in_thread(app, ready_timeout: float = 30.0, stop_timeout: float = 20.0):
    """在本进程的一个线程里用 uvicorn 服务 ``app``（空闲端口）；产出端口号，退出时停下服务。"""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + ready_timeout
    while not server.started:
        assert time.time() < deadline and thread.is_alive(), f"服务 {ready_timeout:g} 秒内没有就绪"
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=stop_timeout)
    assert not thread.is_alive(), f"服务 {stop_timeout:g} 秒内没有停下"


@pytest.fixture(scope="session")
def serve_in_thread():
    """``with serve_in_thread(app) as port:``：真的 uvicorn 服务（同一进程里的线程、空闲端口），供 HTTP 客户端测试。"""
    return _serve_in_thread


def _sgd_reference(model, blocks, steps: int, batch: int, lr: float):
    """并行训练要等于的单进程参照：``model`` 的一份拷贝用 SGD 整批训练 ``steps`` 步（损失是整批目标的平均；
    与第 9 章相同，PAD 与 BOS 目标不计——这里直接写出掩码，不借用库的 ``loss_targets``）。

    返回 (每步的损失, 训练后的参数 {名字: 张量})；``model`` 本身不变。
    """
    import torch.nn.functional as F

    from tformer_lib.lm import make_lm
    from tformer_lib.specials import BOS, PAD

    ref = make_lm(model.config)
    ref.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(ref.parameters(), lr=lr)
    losses = []
    for s in range(steps):
        b = blocks[s * batch : (s + 1) * batch]  # (batch, T+1)
        optimizer.zero_grad()
        targets = torch.where(b[:, 1:] == BOS, PAD, b[:, 1:])  # (batch, T)：下一篇文档的 BOS 不用预测
        loss = F.cross_entropy(ref(b[:, :-1]).flatten(0, 1), targets.flatten(), ignore_index=PAD)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach() for k, v in ref.named_parameters()}


@pytest.fixture(scope="session")
def sgd_reference():
    """``sgd_reference(model, blocks, steps, batch, lr) -> (losses, params)``：流水线测试共用的单进程 SGD 参照。"""
    return _sgd_reference
