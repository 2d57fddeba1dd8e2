"""Trace loaders: every public trace format in `data/traces/` read into one shape.

A trace is a list of `Session`s; a session is a time-ordered tuple of `Request`s. Formats
(field meanings: `data/traces/README.md`):
- AgentX "Weka" JSON (one session per file, 64-token `hash_ids`, nested subagents),
- Mooncake JSONL (one request per line, 512-token `hash_ids`, no session ids),
- Azure LLM CSV (TIMESTAMP, ContextTokens, GeneratedTokens; no hashes),
- Applied Compute `trie` JSONL (one agent trace per line: turn lengths and tool latencies),
- TraceLab round JSONL (one agent step per line, grouped by `session_id`).

`hash_ids` hold one id per *full* block of the prompt (AgentX: floor(in/64) ids), prefix-chained:
equal leading ids mean a shared prefix. `hash_scope` says whether ids are comparable across
sessions ("global") or only within one root session and its subagents ("local").
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from model.specs.errors import SpecError

SessionKind = Literal["main", "subagent", "request"]
AGENTX_BLOCK_TOKENS = 64  # AgentX / kv-cache-tester `block_size`
MOONCAKE_BLOCK_TOKENS = 512  # Mooncake FAST'25 traces (kvcache-ai/Mooncake FAST25-release)


@dataclass(frozen=True, eq=False)
class Request:
    t_s: float  # arrival on the root session's clock (subagent requests made absolute)
    input_tokens: int
    output_tokens: int
    hash_ids: np.ndarray | None = None  # int64, one per full block of the prompt
    block_tokens: int | None = None  # tokens per hash block
    think_time_s: float = 0.0  # client gap before this request (tool call or human)
    api_time_s: float | None = None  # recorded server time, when the trace has it
    cached_tokens: int | None = None  # provider-reported cache read (TraceLab), not replayed
    model: str = ""


@dataclass(frozen=True, eq=False)
class Session:
    session_id: str
    requests: tuple[Request, ...]
    parent_id: str | None = None  # the spawning session (subagents)
    kind: SessionKind = "main"
    root_id: str = ""  # the top-level session: routing stickiness and the hash namespace
    hash_scope: Literal["local", "global", "none"] = "local"
    source: str = ""  # file it was read from
    spawn_t_s: float = 0.0  # when it was spawned on the root clock (subagents)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def input_tokens(self) -> int:
        return int(sum(r.input_tokens for r in self.requests))

    @property
    def output_tokens(self) -> int:
        return int(sum(r.output_tokens for r in self.requests))


# --------------------------------------------------------------------------------------- helpers


Amount = Annotated[float, Field(ge=0, strict=True)]  # a JSON number >= 0: tokens or seconds
Whole = Annotated[int, Field(ge=0, strict=True)]  # a JSON whole number >= 0


class TraceRecord(BaseModel):
    """One record of a trace file; the fields each format reads, checked (others ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class AgentxRequestRecord(TraceRecord):
    t: Amount  # seconds on the session clock (a subagent's may be relative to its spawn)
    in_tokens: Amount = Field(alias="in")
    out: Amount
    think_time: Amount | None = None
    api_time: Amount | None = None
    model: Any = ""


class AgentxSubagentRecord(TraceRecord):
    t: Amount  # the spawn
    requests: list[Any]


class MooncakeRecord(TraceRecord):
    timestamp: Amount  # ms
    input_length: Amount
    output_length: Amount


class AppliedComputeRecord(TraceRecord):
    num_turns: Whole
    input_prompt_length: Whole
    assistant_response_length: list[Whole]
    tool_call_output_length: list[Whole]
    tool_call_latency: list[Amount]
    final_assistant_response_length: Whole

    @model_validator(mode="after")
    def _one_entry_per_turn(self) -> AppliedComputeRecord:
        for key in ("assistant_response_length", "tool_call_output_length", "tool_call_latency"):
            if len(getattr(self, key)) != self.num_turns:
                raise ValueError(f"{key} has {len(getattr(self, key))} entries; num_turns is "
                                 f"{self.num_turns}")
        return self


class TracelabRecord(TraceRecord):
    session_id: Annotated[str, Field(strict=True)]
    round_index: Whole = 0
    timing_events: list[Any]
    input_tokens_total: Amount
    output_tokens: Amount
    prefix_tokens: Amount | None = None
    model: Any = ""


class AzureRow(TraceRecord):
    TIMESTAMP: datetime
    ContextTokens: Annotated[int, Field(ge=0)]
    GeneratedTokens: Annotated[int, Field(ge=0)]


# pydantic's error types in the words of the other spec errors: what the field allows
_ALLOWED = {"missing": "missing", "greater_than_equal": "must be >= {ge}",
            "float_type": "must be a number >= 0", "int_type": "must be a whole number >= 0",
            "int_from_float": "must be a whole number >= 0", "list_type": "must be a list",
            "string_type": "must be a string", "model_type": "must be an object",
            "dict_type": "must be an object"}


def _record(model: type[TraceRecord], obj: Any, path: Path, where: str):
    """`obj` read as `model`; a bad field is one SpecError naming the file, the field and what
    it allows."""
    try:
        return model.model_validate(obj)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(x) for x in (where, *first["loc"]) if str(x))
        why = _ALLOWED.get(first["type"], str(first["msg"]).removeprefix("Value error, "))
        why = why.format(**first.get("ctx", {}))
        if first["type"] != "missing":
            why += f", got {first.get('input')!r:.40}"
        raise SpecError(path, field, why) from None


def _hash_array(values: Any, path: Path, where: str) -> np.ndarray:
    if not isinstance(values, list):
        raise SpecError(path, f"{where}.hash_ids", "expected a list of integers")
    try:
        arr = np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise SpecError(path, f"{where}.hash_ids", "expected a list of integers") from None
    if arr.ndim != 1:
        raise SpecError(path, f"{where}.hash_ids", "expected a flat list of integers")
    return arr


def append_only_hash_ids(inputs: Iterable[int], block_tokens: int, start_id: int = 0) -> list[np.ndarray]:
    """Synthetic prefix-chained ids for a session whose every prompt extends the previous one:
    block b of every request gets the same id, so the replay sees the exact append-only reuse."""
    return [np.arange(start_id, start_id + int(n) // block_tokens, dtype=np.int64) for n in inputs]


# ---------------------------------------------------------------------------------------- AgentX


def _agentx_request(raw: Any, path: Path, where: str, t0: float, block: int) -> Request:
    rec = _record(AgentxRequestRecord, raw, path, where)
    return Request(
        t_s=t0 + rec.t, input_tokens=int(rec.in_tokens), output_tokens=int(rec.out),
        hash_ids=_hash_array(raw.get("hash_ids"), path, where), block_tokens=block,
        think_time_s=rec.think_time or 0.0, api_time_s=rec.api_time, model=str(rec.model),
    )


def load_agentx(path: str | Path) -> list[Session]:
    """One AgentX / Weka trace JSON: the main session followed by its subagent sessions.

    Subagent inner `t` is relative to the spawn in the 042026 corpus and on the session clock in
    proxy corpora; inner times earlier than the spawn can only be relative, so they are shifted."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SpecError(path, "(file)", f"not readable AgentX JSON: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
        raise SpecError(path, "requests", "missing: an AgentX trace is an object with a `requests` list")
    session_id = str(doc.get("id", path.stem))
    block = doc.get("block_size", AGENTX_BLOCK_TOKENS)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise SpecError(path, "block_size", f"must be a whole number of tokens >= 1, got "
                                            f"{block!r:.40}")
    scope = doc.get("hash_id_scope", "local")
    if scope not in ("local", "global"):
        raise SpecError(path, "hash_id_scope", f"got {scope!r}; allowed: local, global")
    main: list[Request] = []
    subs: list[Session] = []
    for i, raw in enumerate(doc["requests"]):
        where = f"requests[{i}]"
        if not isinstance(raw, dict):
            raise SpecError(path, where, "expected an object")
        if raw.get("type") == "subagent":
            sub = _record(AgentxSubagentRecord, raw, path, where)
            spawn, inner = sub.t, sub.requests
            times = [float(r["t"]) for r in inner if isinstance(r, dict)
                     and isinstance(r.get("t"), (int, float)) and not isinstance(r["t"], bool)]
            shift = spawn if times and min(times) < spawn else 0.0
            reqs = tuple(_agentx_request(r, path, f"{where}.requests[{j}]", shift, block)
                         for j, r in enumerate(inner))
            agent = str(raw.get("agent_id", f"sa{i}"))
            subs.append(Session(
                session_id=f"{session_id}::sa:{agent}", requests=reqs, parent_id=session_id,
                kind="subagent", root_id=session_id, hash_scope=scope, source=str(path),
                spawn_t_s=spawn, meta={"subagent_type": raw.get("subagent_type", "")},
            ))
        else:
            main.append(_agentx_request(raw, path, where, 0.0, block))
    return [Session(session_id=session_id, requests=tuple(main), kind="main", root_id=session_id,
                    hash_scope=scope, source=str(path),
                    meta={k: doc[k] for k in ("tool_tokens", "system_tokens") if k in doc}),
            *subs]


# -------------------------------------------------------------------------------------- Mooncake


def _jsonl(path: Path) -> list[tuple[int, dict]]:
    rows = []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(path, "(file)", f"not readable: {err}") from None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise SpecError(path, f"line {n}", f"not JSON: {err.msg}") from None
        if not isinstance(obj, dict):
            raise SpecError(path, f"line {n}", "expected a JSON object")
        rows.append((n, obj))
    return rows


def load_mooncake(path: str | Path, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[Session]:
    """Mooncake JSONL: each line one request (`timestamp` in ms); ids are global across lines."""
    path = Path(path)
    sessions = []
    for n, obj in _jsonl(path):
        where = f"line {n}"
        rec = _record(MooncakeRecord, obj, path, where)
        req = Request(
            t_s=rec.timestamp / 1000.0, input_tokens=int(rec.input_length),
            output_tokens=int(rec.output_length),
            hash_ids=_hash_array(obj.get("hash_ids"), path, where),
            block_tokens=block_tokens,
        )
        sid = f"{path.stem}:{n}"
        sessions.append(Session(sid, (req,), kind="request", root_id=sid, hash_scope="global",
                                source=str(path)))
    return sessions


# ----------------------------------------------------------------------------------------- Azure


def load_azure(path: str | Path) -> list[Session]:
    """Azure LLM inference CSV (Splitwise 2023 / DynamoLLM 2024): one request per row."""
    path = Path(path)
    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise SpecError(path, "(file)", f"not readable: {err}") from None
    needed = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    if rows and any(k not in rows[0] for k in needed):
        raise SpecError(path, "header", f"expected columns {', '.join(needed)}")
    sessions, t0 = [], None
    for n, row in enumerate(rows, start=2):
        stamp_text = (row.get("TIMESTAMP") or "").strip()[:26]
        rec = _record(AzureRow, {**row, "TIMESTAMP": stamp_text}, path, f"row {n}")
        stamp, ctx, gen = rec.TIMESTAMP, rec.ContextTokens, rec.GeneratedTokens
        t0 = stamp if t0 is None else t0
        sid = f"{path.stem}:{n}"
        req = Request(t_s=(stamp - t0).total_seconds(), input_tokens=ctx, output_tokens=gen)
        sessions.append(Session(sid, (req,), kind="request", root_id=sid, hash_scope="none",
                                source=str(path)))
    return sessions


# -------------------------------------------------------------------------------- Applied Compute


def load_applied_compute(path: str | Path, block_tokens: int = AGENTX_BLOCK_TOKENS) -> list[Session]:
    """Applied Compute `trie` JSONL: turn i's prompt = the previous prompt + assistant response +
    tool output; the gap before turn i+1 is the tool latency. Prompts are synthetic and unique per
    trace, so hash ids are an append-only chain private to the trace (`append_only_hash_ids`)."""
    path = Path(path)
    sessions = []
    for n, obj in _jsonl(path):
        rec = _record(AppliedComputeRecord, obj, path, f"line {n}")
        turns = rec.num_turns
        inputs, outputs, gaps = [rec.input_prompt_length], [], [0.0]
        for i in range(turns):
            outputs.append(rec.assistant_response_length[i])
            inputs.append(inputs[-1] + outputs[-1] + rec.tool_call_output_length[i])
            gaps.append(rec.tool_call_latency[i])
        outputs.append(rec.final_assistant_response_length)
        hashes = append_only_hash_ids(inputs, block_tokens)
        t, reqs = 0.0, []
        for i in range(turns + 1):
            t += gaps[i]  # no server time recorded: arrivals count client gaps only
            reqs.append(Request(t_s=t, input_tokens=inputs[i], output_tokens=outputs[i],
                                hash_ids=hashes[i], block_tokens=block_tokens, think_time_s=gaps[i]))
        sid = f"{path.stem}:{n}"
        sessions.append(Session(sid, tuple(reqs), kind="main", root_id=sid, hash_scope="local",
                                source=str(path), meta={"synthetic_hash_ids": True}))
    return sessions


# -------------------------------------------------------------------------------------- TraceLab


def _event_stamps(events: list, path: Path, where: str) -> list[float]:
    """The ISO timestamps of a round's timing events, in seconds; none is one SpecError."""
    try:
        stamps = [datetime.fromisoformat(str(e["timestamp"]).replace("Z", "+00:00")).timestamp()
                  for e in events if isinstance(e, dict) and e.get("timestamp")]
    except ValueError as err:
        raise SpecError(path, where, f"a timestamp is not ISO 8601 ({err})") from None
    if not stamps:
        raise SpecError(path, where, "no timestamps")
    return stamps


def load_tracelab(path: str | Path) -> list[Session]:
    """TraceLab round JSONL: rounds grouped by `session_id`, ordered by `round_index`. A round
    starts at its first timing event; its gap is measured from the previous round's last event."""
    path = Path(path)
    by_session: dict[str, list[tuple[int, dict]]] = {}
    for n, obj in _jsonl(path):
        rec = _record(TracelabRecord, obj, path, f"line {n}")
        by_session.setdefault(rec.session_id, []).append((n, rec, obj))
    sessions = []
    for sid, rows in by_session.items():
        rows.sort(key=lambda r: r[1].round_index)
        reqs, t0, prev_end = [], None, None
        for n, rec, _ in rows:
            stamps = _event_stamps(rec.timing_events, path, f"line {n}.timing_events")
            start, end = min(stamps), max(stamps)
            t0 = start if t0 is None else t0
            reqs.append(Request(
                t_s=start - t0, input_tokens=int(rec.input_tokens_total),
                output_tokens=int(rec.output_tokens),
                think_time_s=0.0 if prev_end is None else max(0.0, start - prev_end),
                cached_tokens=int(rec.prefix_tokens or 0), model=str(rec.model),
            ))
            prev_end = end
        sessions.append(Session(sid, tuple(reqs), kind="main", root_id=sid, hash_scope="none",
                                source=str(path), meta={"provider": rows[0][2].get("provider", "")}))
    return sessions


# --------------------------------------------------------------------------------------- dispatch

FORMATS = ("agentx", "mooncake", "azure", "applied_compute", "tracelab")
_LOADERS = {"agentx": load_agentx, "mooncake": load_mooncake, "azure": load_azure,
            "applied_compute": load_applied_compute, "tracelab": load_tracelab}


def detect_format(path: Path) -> str:
    """Guess a file's format from its extension and first record."""
    suffix = path.suffix.lower()
    if suffix == ".json":
        return "agentx"
    if suffix == ".csv":
        return "azure"
    if suffix == ".jsonl":
        try:
            with path.open() as handle:
                first = next((line for line in handle if line.strip()), "")
            obj = json.loads(first) if first else {}
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise SpecError(path, "(file)", f"not readable JSONL: {err}") from None
        if "hash_ids" in obj and "input_length" in obj:
            return "mooncake"
        if "num_turns" in obj:
            return "applied_compute"
        if "session_id" in obj and "input_tokens_total" in obj:
            return "tracelab"
    raise SpecError(path, "(format)", f"unrecognized trace; allowed formats: {', '.join(FORMATS)}")


def load_trace(path_or_folder: str | Path, fmt: str | None = None) -> list[Session]:
    """Load a trace file, or every trace file in a folder (sorted by name, not recursive)."""
    return list(_load_cached(str(Path(path_or_folder).resolve()), fmt))


@lru_cache(maxsize=16)
def _load_cached(path_str: str, fmt: str | None) -> tuple[Session, ...]:
    path = Path(path_str)
    if fmt is not None and fmt not in _LOADERS:
        raise SpecError(path, "format", f"got {fmt!r}; allowed: {', '.join(FORMATS)}")
    if path.is_dir():
        files = sorted(p for p in path.iterdir()
                       if p.is_file() and p.suffix.lower() in (".json", ".jsonl", ".csv"))
        if not files:
            raise SpecError(path, "(folder)", "no .json, .jsonl or .csv trace files in it")
    elif path.is_file():
        files = [path]
    else:
        raise SpecError(path, "(path)", "no such trace file or folder")
    sessions: list[Session] = []
    for file in files:
        sessions.extend(_LOADERS[fmt or detect_format(file)](file))
    return tuple(sessions)


def load_traces(paths: Iterable[str | Path]) -> list[Session]:
    """Several files or folders, concatenated in the order given."""
    out: list[Session] = []
    for p in paths:
        out.extend(load_trace(p))
    return out


def requests_table(sessions: Iterable[Session]):
    """One row per request (pandas DataFrame): the flat view profile fitting reads."""
    import pandas as pd  # only this table needs pandas: kept off the loaders' import path

    rows = []
    for s in sessions:
        for i, r in enumerate(s.requests):
            rows.append({
                "session_id": s.session_id, "root_id": s.root_id, "kind": s.kind, "turn": i,
                "t_s": r.t_s, "input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
                "think_time_s": r.think_time_s, "api_time_s": r.api_time_s,
                "cached_tokens": r.cached_tokens,
                "blocks": None if r.hash_ids is None else len(r.hash_ids),
            })
    return pd.DataFrame(rows)
