"""The flake hunt (scripts/flake_hunt.py) on a module of its own: every round run, each failure written down with its
test and first error line, the report appended to, a failing hunt's exit status 1."""

import subprocess
import sys
from pathlib import Path

MODULE = """
def test_passes():
    pass

def test_fails():
    assert 1 == 2, "one is not two"
"""


def test_a_hunt_reports_each_rounds_failures_and_fails(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(MODULE)
    report = tmp_path / "hunt.md"
    hunt = [sys.executable, "-m", "scripts.flake_hunt", "--load", "0", "--report", str(report),
            str(tmp_path / "test_sample.py")]  # fmt: skip
    done = subprocess.run([*hunt, "--rounds", "2"], capture_output=True, text=True, timeout=120, check=False)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "flake hunt: 2 failures in 2 rounds" in done.stdout
    text = report.read_text()
    rows = [line for line in text.splitlines() if "test_fails" in line]
    assert [row.split("|")[1].strip() for row in rows] == ["1", "2"], text
    assert all("one is not two" in row for row in rows), text
    assert "| 1 | 2 | 1 |" in text, "round 1: 2 tests, 1 failed"

    subprocess.run([*hunt, "--rounds", "1"], capture_output=True, timeout=120, check=False)
    assert report.read_text().count("## Flake hunt") == 2, "appended, not overwritten"
