"""随包的结果文件：每个都能用一条命令重新生成，文件里记着那条命令（scripts/regenerate_results.py）。"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import regenerate_results  # noqa: E402


def test_every_shipped_results_file_is_listed_and_names_its_command():
    shipped = sorted(p.stem for p in regenerate_results.RESULTS_DIR.glob("*.json"))
    assert shipped == sorted(regenerate_results.RESULTS), "scripts/regenerate_results.py 的 RESULTS 表与包里的结果文件不一致"
    for name, command in regenerate_results.RESULTS.items():
        data = json.loads((regenerate_results.RESULTS_DIR / f"{name}.json").read_text(encoding="utf-8"))
        assert regenerate_results.recorded_command(data) == command, name


def test_every_command_points_at_a_file_that_exists():
    """每条命令指向的脚本或模块存在（只查文件，不运行测量）。"""
    for name, command in regenerate_results.RESULTS.items():
        words = command.split()
        assert words[0] == "python", name
        target = ROOT / words[1] if words[1] != "-m" else ROOT / (words[2].replace(".", "/") + ".py")
        assert target.exists(), (name, target)


def test_list_prints_every_file():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "regenerate_results.py"), "--list"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    for name in regenerate_results.RESULTS:
        assert name in out
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "regenerate_results.py"), "nonsense"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "nonsense" in bad.stderr
