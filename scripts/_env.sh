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
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[book,test]'
export PATH="$ROOT/.venv/bin:$PATH"
