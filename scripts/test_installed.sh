#!/usr/bin/env bash
# 读者的情形：不在本仓库里，只有装好的包。
#
#   1. 构建轮子（wheel），连同 notebooks 这组可选依赖（sentencepiece、openai、torchao、triton、peft）装进一个新的虚拟环境
#      （按 constraints.txt，torch 取 2.13.0 的 CPU 轮子）；
#   2. 检查“装好的文件”（不是源码树）里有字体、玩具模型、数据和结果文件，且导入的是装好的包；
#   3. 把全部笔记本（各章与 notebooks/solutions/）复制到仓库外的临时目录，用 nbval 在那里重跑，
#      在 ATEN_CPU_CAPABILITY=avx2、=default 与本机自己的指令集下各一遍（并行）：打印的数字不能依赖 CPU 的指令集；
#   4. 卸掉本包，对本仓库的一个本地克隆执行笔记本引导单元里的安装命令（scripts/sync_bootstrap.py 的模板，
#      仓库地址换成克隆的 file:// 地址）：它要装得上、不动已有的 torch，再运行一次时什么也不打印。
#
# 用法：bash scripts/test_installed.sh                 （scripts/test.sh 的最后一步；需要已有的 .venv 来构建轮子）
#       bash scripts/test_installed.sh notebooks/03_attention.ipynb   （只重跑列出的笔记本，作者调试用）
#       TFORMER_CAPS=default bash scripts/test_installed.sh …          （只用一种 CPU 内核）
#       TFORMER_CAPS="avx2 default" bash scripts/test_installed.sh     （不跑本机自己的指令集那一遍）
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
BUILD_PY="$ROOT/.venv/bin/python"
[ -x "$BUILD_PY" ] || { echo "需要先建立 .venv（source scripts/_env.sh）" >&2; exit 2; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/tformer-installed.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export TFORMER_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONHASHSEED=0
unset PYTHONPATH

t0=$(date +%s)
step_start=$t0
step() {  # 打印上一步的用时，再开始下一步
  local now; now=$(date +%s)
  [ -n "${STEP:-}" ] && echo "   （${STEP}：$(( now - step_start )) 秒）"
  STEP="$1"; step_start=$now
  echo "-- $1"
}

step "构建轮子"
"$BUILD_PY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$WORK/dist" .
WHEEL="$(ls "$WORK"/dist/tformer_lib-*.whl)"
echo "   $(basename "$WHEEL")（$(( $(stat -c %s "$WHEEL") / 1024 )) KiB）"

step "新的虚拟环境：装轮子与 nbval（按 constraints.txt）"
"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin/python"
# （本机 pip 配置里的本地索引缺某些包的目录时，pip 对每个包警告一行 “is ignored”：滤掉这些噪声）
quiet_pip() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
quiet_pip "$V" -m pip install --quiet --no-compile --disable-pip-version-check -c constraints.txt "$WHEEL[notebooks]" nbval pytest ipykernel

step "检查装好的文件"
(cd "$WORK" && "$V" - "$WORK/venv" <<'PY'
import re
import sys
from importlib.metadata import files
from pathlib import Path

import tformer_lib

venv = Path(sys.argv[1]).resolve()
assert Path(tformer_lib.__file__).resolve().is_relative_to(venv), f"导入的不是装好的包：{tformer_lib.__file__}"
installed = [str(f) for f in files("tformer_lib")]
need = {
    "中文字体": r"^tformer_lib/fonts/.+\.(otf|ttf)$",
    "字体许可证": r"^tformer_lib/fonts/OFL\.txt$",
    "玩具模型": r"^tformer_lib/checkpoints/.+\.pt$",
    "唐诗数据": r"^tformer_lib/data/poems/.+",
    "基准结果": r"^tformer_lib/results/.+\.json$",
}
missing = [what for what, pat in need.items() if not any(re.search(pat, f) for f in installed)]
assert not missing, f"轮子里缺少：{missing}"
for f in files("tformer_lib"):
    assert Path(f.locate()).exists(), f"记录里有、磁盘上没有：{f}"
print(f"   {len(installed)} 个文件，" + "、".join(need) + " 都在")
PY
)

# 书里打印的数字不能依赖 CPU 的指令集：PyTorch 的两种 CPU 内核（AVX2 与不向量化的 default）各跑一遍全部笔记本，
# 再在这台机器自己的指令集（native：不设 ATEN_CPU_CAPABILITY）下跑一遍——它与前两种之一相同时（只有 AVX2 的 x86、
# 没有向量内核的机器）不重复跑；ARM 上没有 AVX2，跑 default 与本机的。几遍并行、各自单线程、各用一份笔记本副本与
# 缓存目录。提交的输出是在作者机器自己的指令集（至今都是 AVX-512）下执行出来的，所以在 AVX-512 的 CI 上这三遍核对的是
# 三种内核给出同样的输出，在别的 CPU 上还多核对一种。2026-12-04 在 2 核的 AMD EPYC（AVX-512）上实测：三遍并行
# 760 秒，CPU 时间共 1,480 秒（只跑两遍时约少三分之一）。TFORMER_CAPS 可以指定只跑哪几种。
# TorchInductor 的编译缓存也各用一份：它的缓存键不含 ATEN_CPU_CAPABILITY，在另一种指令集下编译好的 C++ 内核
# 被拿来用时会报 “SystemError: <built-in function kernel> returned a result with an exception set”（torch 2.13，第 14 章）。
# oneDNN 另有自己的指令集选择，只看硬件：在有 AMX 的 Intel CPU 上只降 ATen 的内核集，bf16 的 flash 注意力会走 AMX 的
# 打包路径并报 “pack_vnni2 is only supported when avx512 is supported”（torch 2.13，第 11 章）。所以两者一起降：
# avx2 配 ONEDNN_MAX_CPU_ISA=AVX2，default 配 SSE41（oneDNN 最低的一档），这台机器才真像一台只有该指令集的机器。
onednn_isa() { case "$1" in avx2) echo AVX2 ;; default) echo SSE41 ;; *) echo ALL ;; esac; }
native="$("$V" -c 'import torch; print(torch.backends.cpu.get_cpu_capability().lower())')"
if [ -n "${TFORMER_CAPS:-}" ]; then
  caps="$TFORMER_CAPS"
else
  caps="default"
  [ "$(uname -m)" = x86_64 ] && caps="avx2 default"
  case " $caps " in *" $native "*) ;; *) caps="$caps native" ;; esac  # 本机的指令集与前面的不同时才再跑一遍
fi
lanes=""
for cap in $caps; do lanes="${lanes:+$lanes、}$([ "$cap" = native ] && echo "本机的 $native" || echo "$cap")"; done
step "在仓库外用 nbval 重跑全部笔记本（指令集 $lanes，并行）"
for cap in $caps; do
  book="$WORK/book-$cap"
  mkdir -p "$book/notebooks/solutions" "$book/cache"
  if [ $# -gt 0 ]; then
    for nb in "$@"; do cp "$nb" "$book/$nb"; done
  else
    cp notebooks/*.ipynb "$book/notebooks/"
    if compgen -G "notebooks/solutions/*.ipynb" >/dev/null; then
      cp notebooks/solutions/*.ipynb "$book/notebooks/solutions/"
    fi
  fi
  cp nbval_sanitize.cfg "$book/"
  cp scripts/nbval_kernels.py "$book/conftest.py"  # 内核走 IPC 而不是 TCP 端口：并行的通道不再抢端口（见该文件）
done
pids=()
for cap in $caps; do
  book="$WORK/book-$cap"
  ( start=$(date +%s) rc=0
    if [ "$cap" = native ]; then unset ATEN_CPU_CAPABILITY; else export ATEN_CPU_CAPABILITY=$cap; fi
    cd "$book" && ONEDNN_MAX_CPU_ISA=$(onednn_isa "$cap") \
      TFORMER_CACHE="$book/cache" MPLCONFIGDIR="$book/mpl" \
      TORCHINDUCTOR_CACHE_DIR="$book/inductor" \
      "$V" -m pytest notebooks --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg \
      -p no:cacheprovider -q > "$book/log" 2>&1 || rc=$?
    shown="ATEN_CPU_CAPABILITY=$cap"; [ "$cap" = native ] && shown="本机的指令集（$native）"
    echo "   $shown：$(tail -n 1 "$book/log")（$(( $(date +%s) - start )) 秒）"
    exit $rc ) &
  pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
if [ "$failed" != 0 ]; then
  for cap in $caps; do
    echo "---- ATEN_CPU_CAPABILITY=$cap"; tail -n 150 "$WORK/book-$cap/log"
    echo "---- 内核的标准错误（末尾）"; tail -n 30 "$WORK/book-$cap/kernel-stderr.log" 2>/dev/null || true
  done
  echo "有笔记本的输出与提交的不同（上面是各指令集的日志末尾）" >&2
  exit 1
fi

step "引导单元：对本地克隆执行安装命令"
git clone --quiet "$ROOT" "$WORK/clone"
BRANCH="$(git -C "$WORK/clone" rev-parse --abbrev-ref HEAD)"
CELL="$("$BUILD_PY" -c 'import sys; sys.path.insert(0, "scripts"); import sync_bootstrap as B; print(B.render(sys.argv[1], sys.argv[2]))' \
        "file://$WORK/clone" "$BRANCH")"
"$V" -m pip uninstall --quiet -y tformer_lib
TORCH_BEFORE="$("$V" -c 'import torch; print(torch.__version__, torch.__file__)')"
(cd "$WORK" && quiet_pip "$V" -c "$CELL")
(cd "$WORK" && "$V" - "$TORCH_BEFORE" <<'PY'
import sys

import torch

import tformer_lib  # noqa: F401  装上了

assert f"{torch.__version__} {torch.__file__}" == sys.argv[1], f"torch 被换掉了：{sys.argv[1]} → {torch.__version__}"
print(f"   装上了 tformer_lib；torch 仍是 {torch.__version__}")
PY
)
OUT="$(cd "$WORK" && "$V" -c "$CELL" 2>&1)"
[ -z "$OUT" ] || { echo "已安装时引导单元不应打印任何东西，却打印了：$OUT" >&2; exit 1; }
echo "   已安装时再运行一次：什么也不打印"

step "完成"
echo "从轮子安装的检查全部通过（共 $(( $(date +%s) - t0 )) 秒）。"
