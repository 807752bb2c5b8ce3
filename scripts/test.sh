#!/usr/bin/env bash
# 运行全部测试：库的单元测试 + 每个章节笔记本的 nbval 回归 + 构建全书 + 真实浏览器测试。
# 用法：bash scripts/test.sh        （首次运行会建立 .venv 并安装依赖）
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

# 与其他进程共享 2 个核时，单线程的 torch 反而更快且结果逐位稳定（见 DESIGN §6）。
export TFORMER_THREADS="${TFORMER_THREADS:-1}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export PYTHONHASHSEED=0  # 与 scripts/execute_notebooks.py 相同：集合的迭代顺序不随运行变化

echo "== 1/3 单元测试与笔记本回归（pytest + nbval）"
nbval_args=(--nbval --nbval-current-env)
[ -f nbval_sanitize.cfg ] && nbval_args+=(--nbval-sanitize-with nbval_sanitize.cfg)
notebooks=(notebooks/*.ipynb)
[ -e "${notebooks[0]}" ] || notebooks=()
python -m pytest tests "${notebooks[@]}" "${nbval_args[@]}" -p no:cacheprovider -q

echo "== 2/3 构建全书（警告即错误）"
bash scripts/build_book.sh

echo "== 3/3 真实浏览器测试（headless Chromium）"
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "需要 Debian 的 chromium（/usr/bin/chromium）：sudo apt-get install chromium" >&2
    exit 1
  fi
fi
python scripts/browser_test.py
