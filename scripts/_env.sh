#!/usr/bin/env bash
# 共用的环境准备：在仓库根目录建立 .venv（若不存在），并安装本项目及其 book/test 依赖。
# 被 scripts/test.sh 与 scripts/build_book.sh 以 `source` 方式调用。
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# 依赖已满足时 pip 只做检查，几秒即可返回。constraints.txt 固定复现书中输出的精确版本（torch==2.13.0 等）；
# 包本身的元数据只写下界（读者环境里已有的 torch 不会被换掉）。
if .venv/bin/python -c "import tformer_lib, jupyter_book, nbval" 2>/dev/null; then
  quiet=--quiet
else  # 第一次：说清楚在做什么、要多久，pip 每个包打印一行（Collecting …/Downloading …）
  echo "首次运行：在 $ROOT/.venv 里安装本项目及 book/test 依赖（torch CPU 版、jupyter-book、transformers 等，" \
       "约 1.5 GB；本项目的机器上 70 秒到 4 分钟，看网速）……"
  quiet=
fi
.venv/bin/python -m pip install $quiet --disable-pip-version-check -c constraints.txt -e '.[book,test]'
export PATH="$ROOT/.venv/bin:$PATH"
