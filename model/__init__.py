"""Servecast: analytical performance and cost model of LLM serving for agentic traffic."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""Repository root: hardware/, data/, notebooks/ and papers/ live here."""

__version__ = "0.1.0"
