"""安装文件的一致性：environment.yml 与 pyproject.toml 列出同一组依赖；公开名字都能从包顶层导入。"""

import re
import tomllib
from pathlib import Path

import tformer_lib

ROOT = Path(__file__).resolve().parents[1]


def _normalise(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower()


def _pyproject_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs.extend(extra)
    return {_normalise(r) for r in reqs}


def _environment_requirements() -> set[str]:
    lines = (ROOT / "environment.yml").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    reqs = set()
    for line in lines[start + 1 :]:
        item = line.split("#", 1)[0].strip()
        if item.startswith("- ") and item != "- -e .":
            reqs.add(_normalise(item[2:]))
    return reqs


def test_environment_yml_mirrors_pyproject():
    assert _environment_requirements() == _pyproject_requirements()


def test_torch_pin_takes_the_local_cpu_wheel():
    torch_req = next(r for r in _pyproject_requirements() if r.startswith("torch"))
    assert "<2.14" in torch_req, "a bare or open-ended torch requirement resolves to a multi-GB CUDA build"
    book = next(r for r in _pyproject_requirements() if r.startswith("jupyter-book"))
    assert "<2" in book, "jupyter-book 2.x is a different product that cannot build offline"


def test_design_contract_names_import_from_package():
    for name in ["sinusoidal_positional_encoding", "scaled_dot_product_attention", "MultiHeadAttention",
                 "causal_mask", "padding_mask", "TransformerConfig", "make_model", "PAD", "BOS", "EOS", "UNK"]:
        assert hasattr(tformer_lib, name), name
    assert [tformer_lib.PAD, tformer_lib.BOS, tformer_lib.EOS, tformer_lib.UNK] == [0, 1, 2, 3]
