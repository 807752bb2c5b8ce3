#!/usr/bin/env python
"""作者用：就地重新执行 ``notebooks/`` 里的每个章节笔记本（及 ``notebooks/solutions/`` 里的参考答案），保存输出与小部件状态。

书是从笔记本里存好的输出构建的（``_config.yml`` 里 ``execute_notebooks: "off"``），
nbval 在测试里检查这些输出仍然与代码一致。改了库或笔记本之后，运行::

    .venv/bin/python scripts/execute_notebooks.py              # 全部笔记本（章节 + 参考答案）
    .venv/bin/python scripts/execute_notebooks.py notebooks/03_attention.ipynb   # 指定的笔记本

它对每个笔记本：

* 用 nbclient 在笔记本所在目录执行（每个单元有超时，默认 300 秒，``--timeout`` 可改），
  ``store_widget_state=True``：交互小部件的状态写进笔记本元数据，HTML 书里的小部件因此能离线显示；
* 固定环境：CPU、单线程（``TFORMER_THREADS=1``、``OMP_NUM_THREADS=1`` 等）、matplotlib 的 inline 后端、
  ``PYTHONHASHSEED=0``；随机种子由每章第一个单元 ``setup()`` 设定；
* 执行出错就停下并报告是哪个单元（不写回文件）；
* 去掉易变的元数据：每个单元的执行时间戳、``metadata.execution``、``widgets`` 之外的运行期杂项，
  内核信息统一成 ``python3``；相邻的 stdout/stderr 片段合并，使 git diff 只显示真正的内容变化。

nbclient 偶尔在 ``ipywidgets.interact`` 单元上等到超时（见 ``_ext/tformer_book.py`` 的说明），
这里加载同一个补丁。
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# 在导入 nbclient / 启动内核之前固定环境；内核进程继承这些变量。
ENV_DEFAULTS = {
    # 内核里要用 inline 后端（图才会作为 PNG 输出存进笔记本）；MPLBACKEND=Agg 会让图消失
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    "PYTHONHASHSEED": "0",
    "TFORMER_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "CUDA_VISIBLE_DEVICES": "",
    "TQDM_DISABLE": "1",
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",
}

#: 每个单元元数据里要去掉的键（执行时间戳等）
VOLATILE_CELL_METADATA = ("execution", "collapsed", "scrolled", "ExecuteTime")
#: 笔记本元数据里保留的键；其余（如编辑器状态）一律去掉
KEPT_NOTEBOOK_METADATA = ("kernelspec", "language_info", "widgets")


def _prepare_env() -> None:
    for key, value in ENV_DEFAULTS.items():
        os.environ[key] = value
    # 让内核能 import tformer_lib（即使没有 pip install -e）
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


def strip_volatile(nb) -> None:
    """去掉执行时间戳等易变元数据（就地修改）。"""
    nb.metadata = {k: v for k, v in nb.metadata.items() if k in KEPT_NOTEBOOK_METADATA}
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    info = nb.metadata.get("language_info")
    if info:
        nb.metadata["language_info"] = {
            k: info[k] for k in ("name", "file_extension", "mimetype", "pygments_lexer") if k in info
        }
    for cell in nb.cells:
        for key in VOLATILE_CELL_METADATA:
            cell.metadata.pop(key, None)
        if cell.cell_type == "code":
            merged = []
            for output in cell.get("outputs", []):
                output.get("metadata", {}).pop("execution", None)
                # 相邻的同名 stream 输出合并成一个：内核把 print 拆成几条消息的方式每次不同，
                # 合并后存下来的笔记本才不会因此产生无意义的 diff
                if (output.get("output_type") == "stream" and merged
                        and merged[-1].get("output_type") == "stream"
                        and merged[-1].get("name") == output.get("name")):
                    merged[-1]["text"] += output["text"]
                else:
                    merged.append(output)
            cell["outputs"] = merged


def execute_one(path: Path, timeout: int, kernel_name: str) -> float:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(path.parent)}},
        store_widget_state=True,
        record_timing=False,
        allow_errors=False,
        iopub_timeout=10,
        shell_timeout_interval=1,
    )
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    strip_volatile(nb)
    nbformat.validate(nb)
    # 先写临时文件再改名：执行中断时不会留下半个笔记本
    tmp = path.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, path)
    return elapsed


def default_notebooks() -> list[Path]:
    """章节笔记本，然后是参考答案笔记本（各自按文件名排序），以下划线开头的草稿除外。"""
    return [p for pattern in ("notebooks/*.ipynb", "notebooks/solutions/*.ipynb")
            for p in sorted(ROOT.glob(pattern)) if not p.name.startswith("_")]


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:  # 仓库之外的笔记本（例如测试用的临时副本）
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="要执行的笔记本（默认：notebooks/*.ipynb 与 notebooks/solutions/*.ipynb 全部，"
                             "_ 开头的草稿除外）")
    parser.add_argument("--timeout", type=int, default=300, help="每个单元的超时秒数（默认 300）")
    parser.add_argument("--kernel", default="python3", help="内核名（默认 python3）")
    args = parser.parse_args(argv)

    _prepare_env()
    sys.path.insert(0, str(ROOT / "_ext"))
    from tformer_book import patch_zmq_polling  # noqa: E402

    patch_zmq_polling()

    # 默认：notebooks/ 与 notebooks/solutions/ 下全部笔记本，以下划线开头的草稿除外
    paths = args.notebooks or default_notebooks()
    if not paths:
        print("notebooks/ 里没有笔记本。", file=sys.stderr)
        return 1
    failed = []
    for path in paths:
        path = path.resolve()
        print(f"执行 {_shown(path)} …", flush=True)
        try:
            elapsed = execute_one(path, args.timeout, args.kernel)
        except Exception as exc:  # nbclient 的 CellExecutionError / CellTimeoutError 等
            failed.append(path)
            print(f"  失败：{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            continue
        print(f"  完成，用时 {elapsed:.1f} 秒", flush=True)
    if failed:
        print("以下笔记本执行失败（未写回）：" + ", ".join(_shown(p) for p in failed),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
