"""A script written for flash-attn runs unchanged with `import flashport as flash_attn`."""

import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")


def test_flash_attn_script_runs_unchanged():
    script = pathlib.Path(__file__).with_name("flash_attn_script.py")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=dict(os.environ),
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "flash_attn_script: OK" in result.stdout
