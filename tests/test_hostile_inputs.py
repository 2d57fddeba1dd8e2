"""Impossible command-line inputs get one error line naming the flag or field and what it
allows, and exit 2 (the CLI's user-error exit, model.frontends.cli.main); never a traceback and
never a number. The cases are the ones a hostile user tried: each used to answer with an
impossible number (negative TTFT, a TPOT of 0.23 us, a padding fraction of 4.7e16) or to accept
an impossible plan."""

from __future__ import annotations

import json

import pytest

from model import ROOT
from model.frontends.cli import main

EST = ["estimate", "--arch", "minimax-m3", "--hardware", "b300", "--isl", "1000", "--osl", "100",
       "--concurrency", "4"]
SERVE = ["serve", "--arch", "minimax-m3", "--hardware", "b300", "--tp", "4", "--workload",
         "agentx-v1", "--concurrency", "4"]
MEMORY = ["memory", "--arch", "minimax-m3", "--hardware", "b300"]

CASES = [
    (EST + ["--max-num-batched-tokens", "-1"], "--max-num-batched-tokens"),
    (EST + ["--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
    (EST + ["--tp", "0"], "tp"),
    (EST + ["--tp", "-2"], "tp"),
    (EST + ["--pp", "0"], "pp"),
    (EST + ["--ep", "-1"], "ep"),
    (EST + ["--redundant-experts", "-1"], "--redundant-experts"),
    (EST + ["--tp", "4", "--ep", "4", "--redundant-experts", "3"], "--redundant-experts 3"),
    (EST[:-1] + ["0"], "--concurrency"),
    (EST[:5] + ["--isl", "0", "--osl", "100", "--concurrency", "4"], "--isl"),
    (EST[:5] + ["--isl", "100", "--osl", "-5", "--concurrency", "4"], "--osl"),
    (EST + ["--prefix", "-1"], "--prefix"),
    (EST + ["--spec-tokens", "3", "--spec-acceptance", "1.5"], "spec"),
    (SERVE + ["--spec-tokens", "3", "--spec-acceptance", "50"], "--spec-acceptance"),
    (SERVE + ["--spec-tokens", "-1"], "--spec-tokens"),
    (SERVE[:-1] + ["0"], "--concurrency"),
    (SERVE + ["--max-num-seqs", "0"], "--max-num-seqs"),
    (SERVE + ["--attention-backend", "flash"], "--attention-backend: allowed default, triton"),
    (SERVE + ["--draft-attention-backend", "flash"],
     "--draft-attention-backend: allowed same, default, triton"),
    (["plan", "--draft-attention-backend", "flash"], "--draft-attention-backend: allowed"),
    (SERVE + ["--prefill-schedule-interval", "0"], "--prefill-schedule-interval"),
    (SERVE + ["--long-prefill-token-threshold", "-1"], "--long-prefill-token-threshold"),
    (SERVE + ["--hit-rate", "1.5"], "--hit-rate"),
    (SERVE + ["--slo-p90-interactivity", "0"], "--slo-p90-interactivity"),
    (["plan", "--slo-p90-interactivity", "-10"], "--slo-p90-interactivity"),
    (["plan", "--slo-p90-ttft", "0"], "--slo-p90-ttft"),
    (["plan", "--gpus", "0"], "--gpus"),
    # unbounded search: 1,000 GPUs had grown to 24 GB, 100,000 ran for more than 10 minutes
    (["plan", "--gpus", "1000"], "1..576"),
    (["plan", "--gpus", "100000"], "1..576"),
    (["plan", "--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
    (["plan", "--prefill-schedule-interval", "0"], "--prefill-schedule-interval"),
    (MEMORY + ["--context", "-100"], "--context"),
    (MEMORY + ["--tp", "0"], "tp"),
]

# Inputs past the cases above, each tried and found to answer with an impossible number, a
# traceback, unbounded work or a late refusal; what each must say instead
TRACE_FILE = str(ROOT / "data" / "traces" / "cc_traces_weka_042026_sample" / "trace_0001.json")
CACHE = ["cache", TRACE_FILE]
CSV = str(ROOT / "data" / "calibration" / "e2e_measured.csv")
SPLIT = ["--prefill-tp", "4", "--decode-tp", "4"]
NO_NVME = ["--arch", "qwen3-32b", "--hardware", "tpu7x"]  # hardware/tpu7x.yaml: no local NVMe
CASES += [
    (MEMORY + ["--context", "inf"], "--context"),  # had answered NaN sequences
    (MEMORY + ["--context", "1e21"], "--context"),
    # MiniMax M3's window is 1,048,576 tokens (data/architectures/minimax-m3.json)
    (MEMORY + ["--context", "100000000"], "--context = 100,000,000 tokens exceeds"),
    (MEMORY + ["--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
    (MEMORY + ["--tp", "3"], "64 attention heads not divisible by tp=3"),
    (["reload", "--arch", "minimax-m3", "--hardware", "b300", "--tp", "3"], "tp=3"),
    (["reload", *NO_NVME, "--tier", "nvme"], "--tier: nvme: tpu7x has no local NVMe"),
    (["kv", "minimax-m3", "--context", "1000", "--block-size", "1000000000000"],
     "allowed: 1..1,048,576"),
    (["prices", "claude-opus-5", "--on-date", "2026-13-45"], "allowed a calendar date"),
    (["prices", "claude-opus-5", "--on-date", "2026-02-30"], "allowed a calendar date"),
    (["workload", "show", "agentx", "--seed", "-1"], "--seed"),
    # 10 million sessions had run 50 s and 4.5 GB before failing
    (["workload", "show", "agentx", "--sessions", "10000000"], "--sessions"),
    (SERVE + ["--moe-tp", "0"], "--moe-tp"),  # had read as unset
    (SERVE + ["--seed", "-1"], "--seed"),
    (SERVE[:-1] + ["100000"], "allowed: 1..512 (128 per GPU"),  # 4 GPUs
    (["serve", *NO_NVME, "--workload", "agentx-v1", "--allow-beyond-window", "--concurrency", "4",
      "--cache-tiers",
      "hbm,host,nvme"], "--cache-tiers: nvme: tpu7x has no local NVMe"),
    (EST + ["--moe-tp", "0"], "--moe-tp"),
    (EST + SPLIT + ["--prefill-workers", "0"], "--prefill-workers"),  # had read as 1
    (EST + SPLIT + ["--decode-workers", "-3"], "--decode-workers"),  # had divided by zero
    (["plan", "--cost-basis", "foo"], "cost basis 'foo'"),  # had searched 25 s first
    (["plan", "--concurrency", "100000"], "allowed: 1..1,536 (128 per GPU"),  # 12 GPUs
    (["plan", "--deployment", "1x[tp4]", "--arch", "minimax-m3", "--hardware", "b300",
      "--concurrency", "600"], "allowed: 1..512"),
    (["plan", *NO_NVME, "--gpus", "2", "--cache-tiers", "hbm,host,nvme"], "--cache-tiers: nvme"),
    # a bad name is named even where the plan could not fit (minimax-m3 on one B300)
    (EST + ["--kv-dtype", "int3"], "unknown dtype 'int3'"),
    (EST + ["--arrival", "bogus"], "unknown arrival 'bogus'"),
    (EST + ["--attention-backend", "flash"], "--attention-backend: allowed default, triton"),
    # prefill workers exist only when disaggregated: had been ignored without a word
    (SERVE + ["--prefill-hardware", "h100"], "--prefill-hardware h100: prefill workers"),
    (["plan", "--mode", "aggregated", "--prefill-hardware", "h100"],
     "--prefill-hardware h100: prefill workers"),
    (CACHE + ["--seed", "-1", "--replicas", "2", "--routing", "random"], "--seed"),
    (CACHE + ["--replicas", "1000000"], "allowed: 1..1,024"),  # had run past a minute
    (CACHE + ["--pool-tokens", "-5", "--replicas", "2"], "--pool-tokens"),
    (CACHE + ["--pool-tokens", "nan", "--replicas", "2"], "--pool-tokens"),
    (["check", CSV, "--show-skipped", "-5"], "--show-skipped"),
    (["check", CSV, "--tp", "0"], "--tp"),
    (["plan", "--max-num-batched-tokens", "1000000000000"], "--max-num-batched-tokens"),
]


def refusal(argv: list[str], capsys, starts: str = "") -> str:
    """The one error line `argv` must give: exit 2, nothing on stdout, a single stderr line
    `servecast: error: <starts>...`, no traceback."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"servecast: error: {starts}"), err
    return lines[0]


@pytest.mark.parametrize("argv, names", CASES, ids=[" ".join(c[0][-2:]) for c in CASES])
def test_an_impossible_input_is_one_error_line_and_exit_2(argv, names, capsys):
    assert names in refusal(argv, capsys)


BINARY = bytes(range(256)) * 8  # not UTF-8 text
HEADER = (ROOT / "data" / "calibration" / "e2e_measured.csv").read_bytes().split(b"\n")[0] + b"\n"
FILES = [
    ("check", "empty.csv", b"", "not a readable CSV"),
    ("check", "header_only.csv", HEADER, "no rows"),
    ("check", "binary.csv", BINARY, "not a readable CSV"),
    ("cache", "binary.json", BINARY, "not readable AgentX JSON"),
    ("cache", "binary.jsonl", BINARY, "not readable JSONL"),
    ("cache", "binary.csv", BINARY, "not readable"),
    ("cache", "list.json", b"[1, 2]", "requests"),
]


@pytest.mark.parametrize("command, name, content, says", FILES, ids=[f[1] for f in FILES])
def test_an_unreadable_input_file_is_one_error_line_naming_it(command, name, content, says,
                                                              tmp_path, capsys):
    path = tmp_path / name
    path.write_bytes(content)
    assert says in refusal([command, str(path), "--json"], capsys, str(path))


def _config_mutations():
    """Every integer field a real config.json states, set to what no model has: negative, not a
    number, fractional, a boolean, past any model's size, and zero where the field is a size or
    count."""
    import json

    from model.specs.families.common import INT_KEYS, MAX_INT_VALUE, MAX_LAYERS, POSITIVE_KEYS

    out = []
    for name in ("llama-3.1-70b", "deepseek-v3", "mixtral-8x7b"):
        cfg = json.loads((ROOT / "data" / "architectures" / f"{name}.json").read_text())
        for key in sorted(k for k in cfg if k in INT_KEYS):
            huge = MAX_LAYERS + 1 if key == "num_hidden_layers" else MAX_INT_VALUE + 1
            bad = [-1, "eight", 2.5, True, huge] + ([0] if key in POSITIVE_KEYS else [])
            out += [(name, key, value) for value in bad]
    # shapes that cannot go together: 64 query heads in groups of 48 KV heads, 9 of 8 experts
    # per token, a hidden size that is no whole number of heads
    out += [("llama-3.1-70b", "num_key_value_heads", 48), ("mixtral-8x7b", "num_experts_per_tok", 9),
            ("deepseek-v3", "num_experts_per_tok", 257), ("llama-3.1-70b", "hidden_size", 8191)]
    return out


MUTATIONS = _config_mutations()


@pytest.mark.parametrize("name, key, value", MUTATIONS,
                         ids=[f"{n}:{k}={v!r}" for n, k, v in MUTATIONS])
def test_a_mutated_config_json_is_refused_naming_its_field(name, key, value, tmp_path, capsys):
    import json

    cfg = json.loads((ROOT / "data" / "architectures" / f"{name}.json").read_text())
    cfg[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    refusal(["arch", "show", str(path), "--json"], capsys, f"{path}: {key}: ")


@pytest.mark.parametrize("column, value", [("isl", "abc"), ("osl", "-3"), ("tp_size", "0"),
                                           ("pp_size", "1.5"), ("silicon_ttft_ms", "fast"),
                                           ("silicon_tpot_ms", "0")])
def test_check_counts_an_unreadable_row_as_skipped_and_says_why(column, value, tmp_path):
    # the first two aggregated rows of the calibration CSV, the second with one bad cell: the
    # first is still scored, the second is skipped with its column named, never read as 1
    import pandas as pd

    from model.validate.check import check

    rows = pd.read_csv(ROOT / "data" / "calibration" / "e2e_measured.csv")
    rows = rows[rows["mode"] != "disagg"].head(2).astype(object)
    rows.iloc[1, rows.columns.get_loc(column)] = value
    path = tmp_path / "rows.csv"
    rows.to_csv(path, index=False)
    out = check(path)
    assert (out["rows"], out["predicted"]) == (2, 1)
    (skipped,) = out["skipped"]
    assert skipped["reason"].startswith(f"unreadable row: {column}: must be")


def test_a_context_past_the_window_is_refused_unless_extrapolation_is_asked(capsys):
    # Qwen3-32B config.json: max_position_embeddings 40,960. 100,000 + 100 tokens is past it:
    # refused (exit 2, naming the flags and the window), or with --allow-beyond-window answered
    # with the extrapolation stated, as `kv` does for --context
    import json

    args = ["estimate", "--arch", "qwen3-32b", "--hardware", "h200", "--isl", "100000",
            "--osl", "100", "--concurrency", "1", "--json"]
    line = refusal(args, capsys, "--isl + --osl = 100,100 tokens exceeds")
    assert "40,960" in line
    assert main(args + ["--allow-beyond-window"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["feasible"] and "beyond qwen3-32b's window of 40,960" in out["assumptions"][0]
    assert main(["kv", "qwen3-32b", "--context", "50000", "--allow-beyond-window", "--json"]) == 0
    assert "window of 40,960" in json.loads(capsys.readouterr().out)["assumptions"][0]


def _hardware_mutations():
    """The H200 spec (hardware/h200-sxm.yaml) with one number made impossible: negative, zero,
    not a number, absent, or in a unit the loader does not know."""
    sizes = ["hbm_capacity_usable", "hbm_bandwidth", "scale_up_bandwidth_per_direction",
             "scale_up_domain", "scale_out_bandwidth_per_direction", "host_memory_per_gpu",
             "power_tdp"]
    out = [(key, "value", bad) for key in sizes for bad in (-1, 0, "fast", None)]
    out += [(key, None, "absent") for key in sizes]
    out += [(("peak_flops", fmt), "value", bad) for fmt in ("bf16", "fp8") for bad in (-5, 0, "x")]
    out += [("hbm_bandwidth", "unit", "furlongs"), ("hbm_bandwidth", "source", "S999")]
    # an NVMe tier with a capacity and no bandwidth (or the reverse)
    out += [("nvme_bandwidth_per_gpu", "value", 0), ("nvme_capacity_per_gpu", "value", 0)]
    return out


HARDWARE_MUTATIONS = _hardware_mutations()


@pytest.mark.parametrize("key, field, bad", HARDWARE_MUTATIONS,
                         ids=[f"{k}.{f}={b!r}" for k, f, b in HARDWARE_MUTATIONS])
def test_a_mutated_hardware_yaml_is_refused_in_one_line(key, field, bad, tmp_path, capsys):
    import yaml

    spec = yaml.safe_load((ROOT / "hardware" / "h200-sxm.yaml").read_text())
    parent, name = (spec[key[0]], key[1]) if isinstance(key, tuple) else (spec, key)
    if field is None:
        del parent[name]
    else:
        parent[name] = {**parent[name], field: bad}
    path = tmp_path / "chip.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert str(path) in refusal(["hardware", "show", str(path), "--json"], capsys)


TRACE = ROOT / "data" / "traces" / "cc_traces_weka_042026_sample" / "trace_0001.json"
TRACE_MUTATIONS = ([("requests[1]", key, bad) for key in ("t", "in", "out", "hash_ids")
                    for bad in (-1, "x", None, "absent")]
                   + [("requests[1]", "think_time", bad) for bad in (-1, "x")]
                   + [("trace", "requests", "not a list"), ("trace", "block_size", 0),
                      ("trace", "block_size", -64), ("trace", "block_size", 1.5)])


@pytest.mark.parametrize("where, key, bad", TRACE_MUTATIONS,
                         ids=[f"{w}.{k}={b!r}" for w, k, b in TRACE_MUTATIONS])
def test_a_mutated_agentx_trace_is_refused_in_one_line(where, key, bad, tmp_path, capsys):
    # one recorded Claude Code session (SemiAnalysis cc-traces-weka-042026, Apache-2.0) with
    # one field made impossible: the cache replay names the file and the field, never a number
    import json

    doc = json.loads(TRACE.read_text())
    target = doc if where == "trace" else doc["requests"][1]
    if bad == "absent":
        del target[key]
    else:
        target[key] = bad
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    refusal(["cache", str(path), "--json"], capsys, str(path))


TINY = ROOT / "tests" / "data" / "notebooks" / "tiny.py"  # x: float, y: int, label: str, ...
GRID = {"notebook": str(TINY), "parameters": {"label": "t"}, "grid": {"x": [1, 2], "y": [3]}}


def _grid_mutations():
    """A valid grid over tests/data/notebooks/tiny.py with one field made impossible: the wrong
    type, absent, negative, huge, unknown, a value of a type the notebook does not declare."""
    wrong = [5, -1, 10**30, True, "text", [1, 2]]
    out = [(("notebook",), bad) for bad in [5, -1, 10**30, True, [], {"a": 1}, None, "",
                                            "../../../etc/passwd", "nosuch", "absent.ipynb",
                                            "absent"]]
    out += [(("parameters",), bad) for bad in wrong if bad != [1, 2]] + [(("parameters",),
                                                                         [1, 2])]
    out += [(("grid",), bad) for bad in wrong]
    out += [(("grid", "x"), bad) for bad in [5, -1, "text", [], None, {"a": 1}, ["one", 2]]]
    out += [(("grid", "y"), bad) for bad in [[2.5], [True], ["3"], [None]]]
    out += [(("parameters", "label"), bad) for bad in [5, -1.5, True, None, ["t"]]]
    out += [(("parameters", "figure"), bad) for bad in ["yes", 1, None]]
    out += [(("parameters", "nosuch"), 1), (("grid", "nosuch"), [1]),
            (("parameters", "output_dir"), "/tmp"), (("parameters", "x"), 1),
            (("extra",), 1), (("Notebook",), str(TINY))]
    out += [(("cases",), bad) for bad in [5, -1, "text", [], [{}], [5], {"z": 1},
                                          [{"nosuch": 1}], [{"y": "two"}], [{"x": 3}]]]
    out += [(("grid", "y"), list(range(20_000)))]  # 40,000 scenarios: past the cap
    return out


GRID_MUTATIONS = _grid_mutations()


@pytest.mark.parametrize("where, bad", GRID_MUTATIONS,
                         ids=[f"{'.'.join(w)}={str(b)[:20]!r}" for w, b in GRID_MUTATIONS])
def test_a_mutated_grid_file_is_refused_in_one_line(where, bad, tmp_path, capsys):
    import copy

    import yaml

    doc = copy.deepcopy(GRID)
    parent = doc
    for key in where[:-1]:
        parent = parent[key]
    if bad == "absent" and where == ("notebook",):
        del parent[where[-1]]
    else:
        parent[where[-1]] = bad
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(doc))
    argv = ["batch", str(path), "--out", str(tmp_path / "out"), "--json"]
    line = refusal(argv, capsys, f"{path}: ")
    assert where[0].lower() in line.lower()
    assert not (tmp_path / "out").exists()  # refused before anything ran


@pytest.mark.parametrize("name, content, says", [
    ("empty.yaml", b"", "(top level): expected a mapping"),
    ("binary.yaml", BINARY, "file: not UTF-8 text"),
    ("list.yaml", b"- notebook: tiny\n", "(top level): expected a mapping"),
    ("scalar.yaml", b"42\n", "(top level): expected a mapping"),
    ("broken.yaml", b"notebook: [tiny\n", "yaml: not valid YAML"),
    ("int_key.yaml", f"notebook: {TINY}\nparameters: {{1: 2}}\n".encode(), "parameters"),
])
def test_an_unreadable_grid_file_is_one_error_line(name, content, says, tmp_path, capsys):
    path = tmp_path / name
    path.write_bytes(content)
    line = refusal(["batch", str(path), "--out", str(tmp_path / "out"), "--json"], capsys,
                   f"{path}: ")
    assert says in line


@pytest.mark.parametrize("name, content, says", [
    ("binary.ipynb", BINARY, "not a readable notebook"),
    ("list.ipynb", b"[1, 2]", "not a readable notebook"),
    ("plain.py", b"x = 1\n", "no cell tagged 'parameters'"),
    ("broken.py", b'# %% tags=["parameters"]\nx: int = (\n', "not valid Python"),
])
def test_a_grid_naming_a_file_that_is_no_notebook_is_refused(name, content, says, tmp_path,
                                                              capsys):
    import yaml

    notebook = tmp_path / name
    notebook.write_bytes(content)
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"notebook": str(notebook), "grid": {"x": [1]}}))
    line = refusal(["batch", str(path), "--out", str(tmp_path / "out"), "--json"], capsys,
                   f"{path}: notebook: ")
    assert says in line


@pytest.mark.parametrize("argv", [["hardware", "show"], ["workload", "show"],
                                  ["arch", "show"], ["estimate", "--isl", "9", "--osl", "9",
                                                     "--concurrency", "1", "--arch",
                                                     "minimax-m3", "--hardware"]])
@pytest.mark.parametrize("content", [BINARY, None], ids=["binary", "folder"])
def test_a_spec_file_that_is_binary_or_a_folder_is_one_error_line(argv, content, tmp_path,
                                                                  capsys):
    # a hardware spec, a workload profile or a config.json named by path: a binary file (not
    # UTF-8 text) or a folder is refused naming it, never a codec traceback
    path = tmp_path / ("spec.json" if argv[:2] == ["arch", "show"] else "spec.yaml")
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    refusal(argv + [str(path), "--json"], capsys)


def test_memory_sizes_a_context_within_the_window_unless_extrapolation_is_asked(capsys):
    # Qwen3-32B config.json: max_position_embeddings 40,960. The default context is 131,072
    # tokens or the window where shorter; 50,000 is refused naming the window, or answered with
    # the extrapolation stated under --allow-beyond-window, as kv and estimate do
    import json

    args = ["memory", "--arch", "qwen3-32b", "--hardware", "h200", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["context_tokens"], out["assumptions"]) == (40960, [])
    assert "40,960" in refusal(args + ["--context", "50000"], capsys, "--context = 50,000 tokens")
    assert main(args + ["--context", "50000", "--allow-beyond-window"]) == 0
    assert "window of 40,960" in json.loads(capsys.readouterr().out)["assumptions"][0]


def test_a_load_past_every_step_is_a_stated_unstable_result(tmp_path, capsys):
    # A valid profile of 10^11-token prompts and outputs collapses the closed loop's root
    # bracket (model.serve.load_rate); serve states it unstable with the solver's reason
    # (model.serve.engine.serve) instead of a ZeroDivisionError traceback.
    profile = (ROOT / "data" / "workloads" / "fixed-1k1k.yaml").read_text()
    huge = tmp_path / "huge.yaml"
    huge.write_text(profile.replace("value: 1024", "value: 100000000000"))
    assert "100000000000" in huge.read_text()
    assert main(["serve", "--arch", "llama-3.1-70b", "--hardware", "h200", "--tp", "4",
                 "--workload", str(huge), "--concurrency", "4", "--allow-beyond-window",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stable"] is False
    assert out["reason"].startswith("unstable: the queue solver failed")
    assert out["tpgs"] is None


def test_a_workload_past_the_window_is_refused_or_stated(capsys):
    # qwen3-32b's config.json: max_position_embeddings 40,960; agentx-v1's contexts have a median
    # of 88K (data/workloads/agentx-v1.yaml, v1.0's stated quantiles), so most requests pass it
    args = ["serve", "--arch", "qwen3-32b", "--hardware", "h200", "--tp", "4", "--workload",
            "agentx-v1", "--concurrency", "4", "--json"]
    line = refusal(args, capsys, "workload agentx-v1: ")
    assert "exceed qwen3-32b's window of 40,960 tokens" in line
    assert "--allow-beyond-window" in line
    assert main(args + ["--allow-beyond-window"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stable"] and any("window of 40,960" in a for a in out["assumptions"])


def test_a_saturated_closed_loop_keeps_littles_law(capsys):
    # MiniMax M3 on 8 B300 (TP8) at 384 AgentX sessions, prefixes in HBM only: the LRU prefix
    # cache thrashes (hit 0.60) and the prefill queue saturates before the response-time law has a
    # root. The rate stays at the last served one and the other sessions wait in the queue, so
    # by Little's law over the request chains (a session is lanes_per_session of them,
    # model.serve.request_mix) a chain's cycle N L / X is its gap, the TTFT and the decode:
    # N L / X - mean TTFT lies between 0 and the profile's mean think gap (lognormal mu 1.3455,
    # sigma 2.1449: 38.3 s) times L (a chain's gaps are weighted by w / E[w], w <= 1) plus the
    # decode of a mean output (agentx-v1's request mix) at the mean TPOT.
    from model.serve.request_mix import request_mix_for
    from model.specs.workload import load_workload

    mix = request_mix_for(load_workload("agentx-v1"))
    lanes = mix.lanes_per_session
    tp8 = [("8" if SERVE[i - 1] == "--tp" else a) for i, a in enumerate(SERVE[:-1])]
    assert main(tp8 + ["384", "--cache-tiers", "hbm", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stable"] and out["bounded_by"] == "prefill_saturation"
    cycle_s = out["concurrency"] * lanes / out["requests_per_s"]
    rest_s = cycle_s - out["mean_ttft_s"]
    assert 0.0 < rest_s < 38.3 * lanes + float(mix.output_tokens.mean()) * out["mean_tpot_s"]


def test_a_token_budget_takes_its_activations_from_the_kv_pool(capsys):
    # One forward pass of max_num_batched_tokens holds its activations in HBM
    # (model.perf.memory.activation_bytes); the step model's KV pool loses what a budget adds
    # past vLLM's default 8,192, and a budget whose activations leave no KV is refused.
    from model.perf.memory import activation_bytes
    from model.perf.parallel import ParallelPlan
    from model.perf.step import build_step_model
    from model.specs.architecture import load_architecture
    from model.specs.hardware import load_hardware

    arch, hw, plan = load_architecture("minimax-m3"), load_hardware("b300"), ParallelPlan(tp=4)
    base = build_step_model(arch, hw, plan)
    big = build_step_model(arch, hw, plan, max_num_batched_tokens=131_072)
    lost = base.kv_pool_bytes_per_gpu - big.kv_pool_bytes_per_gpu
    added = activation_bytes(big.arch, big.plan, 131_072) - activation_bytes(big.arch, big.plan,
                                                                              8_192)
    assert added > 1e9 and abs(lost - added) < 1e-6 * added
    args = SERVE + ["--max-num-batched-tokens", "100000000"]
    line = refusal(args, capsys, "minimax-m3 weights need")
    assert "activations of 100,000,000 batched tokens" in line


def test_the_realistic_dep8_input_answers(capsys):
    # DEP8 without a threshold at the AgentX post's 256 sessions had crashed with a singular
    # matrix; it is a steady state whose percentiles are ordered and whose sessions' cycle
    # (N / X, Little's law) holds the mean TTFT
    args = ["serve", "--arch", "deepseek-v4-pro", "--hardware", "b300", "--dp", "8", "--ep", "8",
            "--workload", "agentx-v1", "--concurrency", "256", "--long-prefill-token-threshold",
            "0", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stable"] and out["tpgs"] > 0
    assert 0 < out["interactivity_tok_s"]["p90"] <= out["interactivity_tok_s"]["p50"]
    assert out["ttft_s"]["p50"] <= out["ttft_s"]["p90"] <= out["ttft_s"]["p99"]
    assert out["concurrency"] / out["requests_per_s"] > out["mean_ttft_s"]
