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
# 依赖已满足时 pip 只做检查，几秒即可返回。
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[book,test]'
export PATH="$ROOT/.venv/bin:$PATH"
