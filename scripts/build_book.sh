#!/usr/bin/env bash
# 构建 HTML 书：bash scripts/build_book.sh
#
# - 先 source scripts/_env.sh：没有 .venv 就建一个，并安装本项目及 book/test 依赖；
# - 书直接用笔记本里存好的输出（不执行笔记本；输出是否最新由 nbval 负责）；
# - 警告即错误（-W），引用检查从严（-n），遇错继续以便一次列出全部问题（--keep-going）；
# - --all：每次从头读全部页面，否则未改动页面上的警告会被增量构建藏起来。
# 额外参数原样传给 jupyter-book（例如 --verbose）。
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
start=$(date +%s)
jupyter-book build . --builder html --all -W -n --keep-going "$@"
echo "书已构建（用时 $(( $(date +%s) - start )) 秒）：$ROOT/_build/html/index.html"
