"""安装文件的一致性与“装本包不动读者的 torch”。

- environment.yml 与 pyproject.toml 列出同一组依赖，两者（以及 scripts/_env.sh、postBuild）都用 constraints.txt；
- 包的元数据对 torch 只写下界；constraints.txt 固定复现书中输出的 torch==2.13.0；
- 在一个已经装了别的 torch 的环境里，``pip install --dry-run --report`` 安装本包的轮子不会动那个 torch；
- 公开名字都能从包顶层导入。
"""

import fcntl
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import tformer_lib

ROOT = Path(__file__).resolve().parents[1]
#: 产生书中全部输出的 torch 版本（constraints.txt 必须固定它）
BOOK_TORCH = "2.13.0"


def _normalise(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _pyproject_requirements() -> set[str]:
    project = _project()
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs.extend(extra)
    return {_normalise(r) for r in reqs}


def _environment_pip_lines() -> list[str]:
    lines = (ROOT / "environment.yml").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    items = []
    for line in lines[start + 1:]:
        item = line.split("#", 1)[0].strip() if not line.strip().startswith("- --") else line.strip()
        if item.startswith("- "):
            items.append(item[2:].strip())
    return items


def _constraints() -> dict[str, Requirement]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            out[req.name.lower().replace("_", "-")] = req
    return out


def test_environment_yml_mirrors_pyproject_and_uses_the_constraints():
    items = _environment_pip_lines()
    reqs = {_normalise(i) for i in items if not i.startswith("-")}
    assert reqs == _pyproject_requirements()
    assert "-c constraints.txt" in items, "environment.yml 的 pip 部分要带 -c constraints.txt"
    assert "-e ." not in items, "本包由 postBuild 安装（环境只装依赖）"


def test_package_metadata_has_only_a_lower_bound_on_torch():
    torch_req = Requirement(next(r for r in _project()["dependencies"] if r.startswith("torch")))
    assert [s.operator for s in torch_req.specifier] == [">="], (
        f"torch 只能写下界（收到 {torch_req}）：上界或精确版本会让 pip 换掉读者环境里更新的 torch")
    book = next(r for r in _pyproject_requirements() if r.startswith("jupyter-book"))
    assert "<2" in book, "jupyter-book 2.x is a different product that cannot build offline"


def test_constraints_pin_the_book_torch_and_are_used_by_every_setup_path():
    pins = _constraints()
    assert str(pins["torch"].specifier) == f"=={BOOK_TORCH}" and pins["torch"].marker is None
    assert torch_base_version() in (BOOK_TORCH, None) or pytest.fail(
        f"测试环境的 torch 是 {version('torch')}，书的输出是用 {BOOK_TORCH} 产生的")
    # 每个约束都针对一个真正的依赖（写错名字的约束会被 pip 静默忽略）
    names = {Requirement(r).name.lower().replace("_", "-") for r in _pyproject_requirements()}
    transitive = {"pillow", "widgetsnbextension", "jupyterlab-widgets", "myst-nb", "myst-parser", "accelerate",
                  "sphinx-book-theme", "pydata-sphinx-theme", "nbclient", "nbformat"}
    assert set(pins) <= names | transitive, set(pins) - names - transitive
    for path in ("scripts/_env.sh", "postBuild", "README.md"):
        text = (ROOT / path).read_text(encoding="utf-8")
        if path == "postBuild":
            assert "--no-deps" in text, "postBuild 只装本包，依赖来自 environment.yml"
        else:
            assert "-c constraints.txt" in text, f"{path} 的安装命令要带 -c constraints.txt"


def torch_base_version() -> str | None:
    try:
        return version("torch").split("+", 1)[0]
    except PackageNotFoundError:
        return None


def _fake_dist(site: Path, name: str, ver: str) -> None:
    info = site / f"{name.replace('-', '_')}-{ver}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n", encoding="utf-8")
    (info / "INSTALLER").write_text("pip\n", encoding="utf-8")
    (info / "RECORD").write_text("", encoding="utf-8")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # 两个 xdist 进程可能同时构建：setuptools 都写仓库里的 build/ 与 *.egg-info，会互相踩坏，所以排队构建
    with open(Path(tempfile.gettempdir()) / "tformer-wheel-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(ROOT)], check=True, timeout=300)
    (whl,) = out.glob("tformer_lib-*.whl")
    return whl


@pytest.mark.parametrize("existing", ["2.14.1", "2.9.0+cu126", "3.0.0"])
def test_installing_the_package_keeps_an_existing_torch(tmp_path, wheel, existing):
    """一个已有 torch（Colab 那样的 CUDA 版、或更新的版本）的环境：pip 解析后要装的只有本包。

    环境是一个新的 venv，依赖都用只有元数据的“假”发行版占位（torch 取 existing 版本），
    这样 ``--no-index`` 也能离线解析，几秒就完。
    """
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=60)
    (site,) = env.glob("lib/python3*/site-packages")
    for req in _project()["dependencies"]:
        name = Requirement(req).name
        if name == "torch":
            _fake_dist(site, "torch", existing)
        else:
            try:
                _fake_dist(site, name, version(name))
            except PackageNotFoundError:
                _fake_dist(site, name, "999")
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "--dry-run", "--quiet",
         "--no-index", "--report", str(report), str(wheel)],
        # 不读本机的 pip 配置：有的机器在那里给 torch 设了上限约束，那与本包的元数据无关
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    installs = {re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower(): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}
    assert installs == {"tformer-lib": tformer_lib.__version__}, f"pip 要装/换：{installs}"


def test_wheel_carries_fonts_checkpoints_data_and_results(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for pattern in (r"tformer_lib/fonts/.+\.otf$", r"tformer_lib/fonts/OFL\.txt$", r"tformer_lib/checkpoints/.+\.pt$",
                    r"tformer_lib/data/poems/.+", r"tformer_lib/widgets/base\.py$"):
        assert any(re.search(pattern, n) for n in names), f"轮子里缺少 {pattern}"


def test_design_contract_names_import_from_package():
    for name in ["sinusoidal_positional_encoding", "scaled_dot_product_attention", "MultiHeadAttention",
                 "causal_mask", "padding_mask", "TransformerConfig", "make_model", "PAD", "BOS", "EOS", "UNK"]:
        assert hasattr(tformer_lib, name), name
    assert [tformer_lib.PAD, tformer_lib.BOS, tformer_lib.EOS, tformer_lib.UNK] == [0, 1, 2, 3]


def test_version_is_one_string_read_by_the_package_metadata(wheel):
    """``tformer_lib.__version__`` 存在，且就是轮子元数据里的版本（pyproject 从它读取，只写一处）。"""
    assert re.fullmatch(r"\d+\.\d+\.\d+", tformer_lib.__version__), tformer_lib.__version__
    assert f"-{tformer_lib.__version__}-" in Path(wheel).name, (Path(wheel).name, tformer_lib.__version__)
