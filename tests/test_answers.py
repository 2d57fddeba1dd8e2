"""The answer cache (model.frontends.answers): a stored answer is the command's own answer, byte
for byte; any change to the arguments, to a file an argument names, or to the model's source is a
new key; off stores nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import diskcache

from model.frontends import answers

SERVE = ["serve", "--arch", "qwen3-32b", "--hardware", "h100", "--tp", "2", "--workload",
         "fixed-1k1k", "--concurrency", "8", "--json"]


def _servecast(args: list[str], cache: Path | str, answers_on: bool = True) -> str:
    env = dict(os.environ, SERVECAST_CACHE_DIR=str(cache))
    if answers_on:
        env.pop(answers.ANSWER_ENV, None)  # the test session turns answers off (conftest)
    else:
        env[answers.ANSWER_ENV] = "off"
    proc = subprocess.run([sys.executable, "-m", "model.frontends.cli", *args], cwd=answers.ROOT,
                          env=env, capture_output=True, text=True, check=True, timeout=300)
    return proc.stdout


def test_a_stored_answer_is_the_commands_own(tmp_path):
    computed = _servecast(SERVE, tmp_path / "off", answers_on=False)
    first = _servecast(SERVE, tmp_path / "on")  # computed and stored
    with diskcache.Cache(str(tmp_path / "on" / "answers")) as store:
        assert len(store) == 1
    second = _servecast(SERVE, tmp_path / "on")  # read back
    assert first == computed and second == computed
    assert not (tmp_path / "off" / "answers").exists()


def test_other_arguments_or_file_contents_are_other_keys(tmp_path):
    base = {"arch": "qwen3-32b", "concurrency": 8}
    assert answers.answer_key("serve", base) == answers.answer_key("serve", dict(base))
    assert answers.answer_key("serve", base) != answers.answer_key("serve", base | {"concurrency": 9})
    assert answers.answer_key("serve", base) != answers.answer_key("plan", base)
    profile = tmp_path / "w.yaml"
    profile.write_text("name: a\n")
    before = answers.answer_key("serve", base | {"workload": str(profile)})
    profile.write_text("name: b\n")
    assert answers.answer_key("serve", base | {"workload": str(profile)}) != before


def test_an_edit_to_the_model_or_its_data_is_a_new_digest(tmp_path):
    tree = tmp_path / "repo"
    for folder, name in (("model/serve", "engine.py"), ("hardware", "h100.yaml"),
                         ("data/architectures/hf", "x_config.json")):
        (tree / folder).mkdir(parents=True)
        (tree / folder / name).write_text("1\n")
    digest = answers.source_digest.__wrapped__
    first = digest(tree)
    assert digest(tree) == first
    (tree / "model/serve/engine.py").write_text("2\n")
    second = digest(tree)
    (tree / "hardware/h100.yaml").write_text("2\n")
    third = digest(tree)
    (tree / "data/architectures/hf/x_config.json").write_text("22\n")  # size and time change
    assert len({first, second, third, digest(tree)}) == 4


def test_off_or_no_cache_folder_stores_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVECAST_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(answers.ANSWER_ENV, "off")
    assert answers.answers_dir() is None
    calls = []
    out = answers.answered("serve", {"x": 1}, lambda: calls.append(1) or {"a": 1.5})
    assert out == {"a": 1.5} and calls == [1]
    monkeypatch.delenv(answers.ANSWER_ENV)
    assert answers.answers_dir() == tmp_path / "answers"
    monkeypatch.setenv("SERVECAST_CACHE_DIR", "off")
    assert answers.answers_dir() is None
    assert not any(tmp_path.iterdir())


def test_a_damaged_store_only_means_computing_again(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVECAST_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(answers.ANSWER_ENV, raising=False)
    (tmp_path / "answers").mkdir()
    (tmp_path / "answers" / "cache.db").write_bytes(b"not a database" * 100)
    assert answers.answered("serve", {"x": 2}, lambda: {"a": 2.5}) == {"a": 2.5}


def test_a_reproduction_asked_again_is_read_back(tmp_path):
    # the workload claims of the vLLM AgentX post (6 claims, about a second computed); the
    # paper's claims.yaml is part of the source digest, the --workers are not part of the key
    args = ["reproduce", "vllm-agentx", "--only", "workload.*", "--json"]
    first = _servecast(args, tmp_path)
    again = _servecast([*args, "--workers", "1"], tmp_path)
    assert first == again and '"claims": 6' in first
    with diskcache.Cache(str(tmp_path / "answers")) as store:
        assert len(store) == 1
