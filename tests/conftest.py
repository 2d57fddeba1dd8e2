"""Shared test helpers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (derandomized), so a run here and a CI run
# agree; HYPOTHESIS_PROFILE=explore draws fresh ones to search for new counter-examples, and
# each one found is then pinned as an @example on its test.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

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


@pytest.fixture(autouse=True, scope="session")
def _answers_computed():
    """Every test computes its answers: tests patch the model at run time, which no answer
    cache key sees (model.frontends.answers). Subprocesses inherit the setting."""
    import os

    from model.frontends.answers import ANSWER_ENV

    before = os.environ.get(ANSWER_ENV)
    os.environ[ANSWER_ENV] = "off"
    yield
    if before is None:
        os.environ.pop(ANSWER_ENV, None)
    else:
        os.environ[ANSWER_ENV] = before
