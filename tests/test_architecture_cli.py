"""`servecast arch list|show` and `servecast kv` as a user runs them: one JSON object on stdout,
and one error line with exit code 2 for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENTRY = "import sys; from model.frontends.cli import main; sys.exit(main(sys.argv[1:]))"


def servecast(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ENTRY, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_arch_show_json_contract():
    proc = servecast("arch", "show", "deepseek-v3", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # DESIGN.md contract keys
    for key in ("name", "total_params", "active_params", "num_layers", "layer_kinds",
                "kv_bytes_per_token"):
        assert key in out
    assert out["name"] == "deepseek-v3" and out["num_layers"] == 61
    assert out["layer_kinds"] == {"mla": 61}
    assert out["kv_bytes_per_token"] == 70_272  # 61 x 576 x 2 B (bf16 default KV)
    assert out["hf_id"] == "deepseek-ai/DeepSeek-V3" and out["weight_dtype"] == "fp8_block"


def test_arch_list_and_kv():
    listed = json.loads(servecast("arch", "list", "--json").stdout)["architectures"]
    assert {"deepseek-v4-pro", "kimi-k3", "minimax-m3"} <= set(listed)
    proc = servecast("kv", "gpt-oss-120b", "--context", "100000", "--kv-dtype", "bf16", "--json")
    out = json.loads(proc.stdout)
    # 36,864 B/token x 100,000 + 18 sliding layers x 2,048 B x 128 (test_kv derivation)
    assert out["kv_bytes"] == 3_691_118_592
    assert out["by_layer_kind"]["swa"] == 18 * 2048 * 128
    assert out["state_bytes"] == 0


def test_kv_state_for_linear_layers():
    out = json.loads(servecast("kv", "kimi-k3", "--context", "0", "--json").stdout)
    assert out["state_bytes"] == 434_110_464 + 15_261_696  # test_kv derivation
    assert out["kv_bytes"] == out["state_bytes"]


@pytest.mark.parametrize("args,message", [
    (("kv", "deepseek-v3", "--context", "-5"), "--context must be >= 0"),
    (("kv", "deepseek-v3", "--context", "10", "--kv-dtype", "fp7"), "unknown dtype 'fp7'"),
    (("arch", "show", "deepseek-v9"), "unknown architecture 'deepseek-v9'"),
    (("kv", "deepseek-v3", "--context", "10", "--block-size", "0"), "--block-size must be"),
    # DeepSeek-V3 config.json: max_position_embeddings 163840
    (("kv", "deepseek-v3", "--context", "1000000"), "exceeds deepseek-v3's maximum context"),
])
def test_bad_input_is_one_line_exit_2(args, message):
    proc = servecast(*args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


def test_malformed_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    proc = servecast("arch", "show", str(path), "--json")
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert "\n" not in line and "num_hidden_layers" in line and str(path) in line
