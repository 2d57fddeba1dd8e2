"""Trace loaders: every format in data/traces/ reads into Sessions with the recorded numbers."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from model import ROOT
from model.specs.errors import SpecError
from model.specs.traces import load_trace, requests_table

TRACES = ROOT / "data" / "traces"
AGENTX = TRACES / "cc_traces_weka_042026_sample"


@pytest.fixture(scope="module")
def agentx():
    return load_trace(AGENTX)


def test_agentx_sample_sessions_and_requests(agentx):
    # 20 trace files; the derived request CSV (data/traces/derived) lists 1,964 requests for
    # these 20 trace ids, and the files nest 23 subagent entries (5 subagent-bearing traces +
    # trace_0003/0004/0010, data/traces/README.md).
    derived = pd.read_csv(TRACES / "derived" / "cc_traces_weka_042026_requests_derived.csv")
    ids = {s.root_id for s in agentx}
    assert len(ids) == 20
    assert sum(len(s.requests) for s in agentx) == len(derived[derived.trace_id.isin(ids)]) == 1964
    assert sum(s.kind == "subagent" for s in agentx) == 23
    # total input tokens equal the CSV's `in` column over the same traces
    assert sum(s.input_tokens for s in agentx) == int(derived[derived.trace_id.isin(ids)]["in"].sum())


def test_agentx_subagent_times_are_made_absolute(agentx):
    # data/traces/cc_traces_weka_042026_sample trace_0003.json: a subagent at t=134.2 s whose inner requests
    # are at t = 0, 6, 14, 19 s relative to the spawn (042026 corpus).
    sub = next(s for s in agentx if s.root_id == "trace_0003" and s.kind == "subagent")
    assert sub.parent_id == "trace_0003"
    assert sub.spawn_t_s == pytest.approx(134.2, abs=0.05)
    assert [round(r.t_s - sub.spawn_t_s, 1) for r in sub.requests[:4]] == [0.0, 6.0, 14.0, 19.0]


def test_agentx_hash_ids_cover_full_blocks(agentx):
    # trace_0274's first request: in = 21,059 tokens -> floor(21059 / 64) = 329 full blocks,
    # ids 1..329 (file content); the partial tail block has no id.
    first = next(s for s in agentx if s.session_id == "trace_0274").requests[0]
    assert first.input_tokens == 21059 and first.block_tokens == 64
    assert len(first.hash_ids) == 21059 // 64 == 329
    assert first.hash_ids[0] == 1 and first.hash_ids[-1] == 329


def test_mooncake_conversation():
    # Mooncake FAST'25 conversation trace: 12,031 lines (data/traces/README.md); first line
    # {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0..13]}.
    sessions = load_trace(TRACES / "mooncake_fast25_conversation_trace.jsonl")
    assert len(sessions) == 12031
    r = sessions[0].requests[0]
    assert (r.t_s, r.input_tokens, r.output_tokens, r.block_tokens) == (0.0, 6758, 500, 512)
    assert list(r.hash_ids) == list(range(14))
    assert sessions[0].hash_scope == "global"


def test_azure_rows_and_clock():
    # azure_llm_2023_code.csv: header + 8,819 rows (data/traces/README.md; the last line has no
    # newline, so `wc -l` shows 8,819);
    # first row 2023-11-16 18:17:03.98, 4,808 context / 10 generated; second 0.052 s later.
    sessions = load_trace(TRACES / "azure_llm_2023_code.csv")
    assert len(sessions) == 8819
    a, b = sessions[0].requests[0], sessions[1].requests[0]
    assert (a.input_tokens, a.output_tokens, a.hash_ids) == (4808, 10, None)
    assert b.t_s == pytest.approx(0.052, abs=1e-6)


def test_applied_compute_turns_accumulate():
    # First trie trace: 24 turns -> 25 requests; prompt 8,749; turn 1's prompt adds the first
    # assistant response (153) and tool output (50): 8,952; gap = tool latency 0.685 s.
    s = load_trace(TRACES / "applied_compute_trie_office_work_8k_sample.jsonl")
    assert [len(x.requests) for x in s] == [25, 36, 23]
    r0, r1 = s[0].requests[:2]
    assert (r0.input_tokens, r0.output_tokens) == (8749, 153)
    assert r1.input_tokens == 8749 + 153 + 50
    assert r1.think_time_s == pytest.approx(0.685)
    assert len(r1.hash_ids) == 8952 // 64 and np.array_equal(r1.hash_ids[:10], r0.hash_ids[:10])


def test_tracelab_rounds_grouped_by_session():
    # Example file: 19 rounds of 2 sessions (10 + 9); round 0: 32,272 input, 27,217 cached,
    # 931 output; round 1 starts 05:40:31.696, 0.049 s after round 0's last event (31.647).
    s = load_trace(TRACES / "tracelab_example_sanitized_round_trace.jsonl")
    assert sorted(len(x.requests) for x in s) == [9, 10]
    first = next(x for x in s if len(x.requests) == 10)
    r0, r1 = first.requests[:2]
    assert (r0.input_tokens, r0.cached_tokens, r0.output_tokens) == (32272, 27217, 931)
    assert r1.think_time_s == pytest.approx(0.049, abs=1e-3)
    assert r1.t_s == pytest.approx(11.545, abs=1e-3)


def test_requests_table_flattens(agentx):
    table = requests_table(agentx)
    assert len(table) == 1964
    assert table["input_tokens"].sum() == sum(s.input_tokens for s in agentx)


def test_errors_name_file_and_field(tmp_path):
    bad = tmp_path / "trace_x.json"
    bad.write_text(json.dumps({"id": "x", "requests": [{"t": 0, "type": "n", "out": 3,
                                                         "hash_ids": [1]}]}))
    with pytest.raises(SpecError, match=r"trace_x\.json: requests\[0\]\.in: missing"):
        load_trace(bad)
    neg = tmp_path / "m.jsonl"
    neg.write_text('{"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": []}\n')
    with pytest.raises(SpecError, match=r"m\.jsonl: line 1\.input_length: must be >= 0"):
        load_trace(neg)
    with pytest.raises(SpecError, match="no such trace file"):
        load_trace(tmp_path / "missing.json")


@pytest.mark.parametrize("name, mutate, field", [
    # an Applied Compute trie line (data/traces/applied_compute_trie_office_work_8k_sample.jsonl)
    # with a response length that is not a count: had raised a ValueError from int()
    ("applied_compute_trie_office_work_8k_sample.jsonl",
     lambda d: d["assistant_response_length"].__setitem__(0, "x"),
     "line 1.assistant_response_length.0: must be a whole number >= 0"),
    ("applied_compute_trie_office_work_8k_sample.jsonl",
     lambda d: d["tool_call_latency"].pop(), "line 1: tool_call_latency has 23 entries"),
    # a TraceLab round with a timestamp that is not ISO 8601: had raised from fromisoformat
    ("tracelab_example_sanitized_round_trace.jsonl",
     lambda d: d["timing_events"][0].__setitem__("timestamp", "yesterday"),
     "line 1.timing_events: a timestamp is not ISO 8601"),
    ("tracelab_example_sanitized_round_trace.jsonl",
     lambda d: d.__setitem__("output_tokens", -3), "line 1.output_tokens: must be >= 0"),
])
def test_a_bad_record_names_its_field(tmp_path, name, mutate, field):
    first, *rest = (ROOT / "data" / "traces" / name).read_text().splitlines()
    doc = json.loads(first)
    mutate(doc)
    path = tmp_path / name
    path.write_text("\n".join([json.dumps(doc), *rest]) + "\n")
    with pytest.raises(SpecError, match=f"{name}: {field}".replace(".", r"\.")):
        load_trace(path)


def test_an_azure_row_with_negative_tokens_is_refused(tmp_path):
    # Azure LLM inference CSV (Splitwise 2023): token counts are whole numbers >= 0
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:17:03.9799600,4808,10\n"
                    "2023-11-16 18:17:04.0319600,-5,8\n")
    with pytest.raises(SpecError, match=r"azure\.csv: row 3\.ContextTokens: must be >= 0"):
        load_trace(path)
