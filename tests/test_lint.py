"""The code passes the project's ruff configuration (pyproject.toml), so the lint runs wherever the tests do."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is in the test extra: bash scripts/setup.sh test"
    paths = ["spade_jax", "experiments", "tests", "benchmarks", "tpu", "scripts"]
    proc = subprocess.run([ruff, "check", *paths], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
