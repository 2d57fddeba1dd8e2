"""Shared test helpers."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> dict:
        return json.loads(self.stdout)


def run_cli(*args: str, cwd: Path | None = None) -> CliResult:
    """Run `servecast ARGS` in a subprocess, as a user would."""
    proc = subprocess.run(
        [sys.executable, "-m", "model.frontends.cli", *args],
        capture_output=True, text=True, cwd=cwd or ROOT, timeout=600,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli():
    return run_cli
