"""Load a model architecture from its Hugging Face config.json into the per-layer `Architecture`.

Names resolve in this order: a path to a config.json; a short slug (`deepseek-v4-pro`) or HF id
(`deepseek-ai/DeepSeek-V4-Pro`) of a file under data/architectures/ (`hf/<org>--<name>_config.json`
preferred over `<slug>.json`); an alias from data/architectures/aliases.yaml. Family knowledge
lives in model/specs/families/; a model_type no family handles fails with the list of known ones.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from model import ROOT
from model.specs.dtypes import dtype
from model.specs.errors import ServecastError, SpecError
from model.specs.families import deepseek, gqa, hybrid, mixed_window
from model.specs.families.common import Builder, Parts
from model.specs.families.quant import QuantScheme, override, parse_quant
from model.specs.layers import Architecture, Linear
from model.specs.specio import load_yaml

DATA = ROOT / "data" / "architectures"

# model_type (of the text config) -> (family name, builder)
FAMILIES: dict[str, tuple[str, Callable[[Builder], Parts]]] = {
    "deepseek_v3": ("deepseek_v3", deepseek.build_mla),
    "kimi_k2": ("deepseek_v3", deepseek.build_mla),
    "deepseek_v32": ("deepseek_v32", deepseek.build_mla),
    "glm_moe_dsa": ("deepseek_v32", deepseek.build_mla),
    "deepseek_v4": ("deepseek_v4", deepseek.build_v4),
    "deepseek_ref": ("deepseek_v4", deepseek.build_v4),
    "llama": ("llama", gqa.build_dense),
    "mistral": ("llama", gqa.build_dense),
    "qwen2": ("llama", gqa.build_dense),
    "qwen3": ("llama", gqa.build_dense),
    "qwen3_vl_text": ("llama", gqa.build_dense),
    "mimo": ("llama", gqa.build_dense),
    "mixtral": ("mixtral", gqa.build_moe),
    "qwen3_moe": ("qwen3_moe", gqa.build_moe),
    "qwen3_vl_moe_text": ("qwen3_moe", gqa.build_moe),
    "minimax_m2": ("minimax_m2", gqa.build_moe),
    "gpt_oss": ("gpt_oss", gqa.build_moe),
    "kimi_linear": ("kimi_linear", hybrid.build_kimi_linear),
    "minimax_m1": ("minimax_m1", hybrid.build_minimax_m1),
    "minimax_m3": ("minimax_m3", hybrid.build_minimax_m3),
    "minimax_m3_vl": ("minimax_m3", hybrid.build_minimax_m3),
    "qwen3_next": ("qwen3_next", hybrid.build_qwen_next),
    "qwen3_5_text": ("qwen3_next", hybrid.build_qwen_next),
    "qwen3_5_moe_text": ("qwen3_next", hybrid.build_qwen_next),
    "nemotron_h": ("nemotron_h", hybrid.build_nemotron_h),
    "llama4_text": ("llama4", mixed_window.build_llama4),
    "gemma4_text": ("gemma4", mixed_window.build_gemma4),
    "step3p7": ("step3p7", mixed_window.build_step3p7),
    "mimo_v2_flash": ("mimo_v2", mixed_window.build_mimo_v2),
}
# model_types seen in data/architectures/ that model.specs.layers cannot express yet, with the reason
UNSUPPORTED: dict[str, str] = {
    "nemotron-nas": "DeciLM / Llama-Nemotron NAS blocks replace attention with no-op in 32 of 80 "
                    "layers; model.specs.layers.Layer requires an attention (needs an AttentionKind "
                    "'none')",
}


@dataclass(frozen=True)
class Entry:
    """One resolvable architecture file."""

    name: str
    hf_id: str
    path: Path
    weight_dtype: str | None = None  # precision implied by an alias (e.g. nvidia/...-FP8)


def _hf_id(path: Path) -> str:
    return path.name.removesuffix("_config.json").replace("--", "/")


@lru_cache(maxsize=1)
def _index() -> tuple[dict[str, Entry], tuple[str, ...]]:
    """Lower-cased name -> Entry, and the canonical names (one per config file)."""
    meta = load_yaml((DATA / "aliases.yaml").read_text()) or {}
    slugs: dict[str, str] = meta.get("slugs") or {}
    by_hf: dict[str, Entry] = {}
    for path in sorted((DATA / "hf").glob("*_config.json")):
        if path.name.endswith("_hf_quant_config.json"):
            continue
        hf_id = _hf_id(path)
        by_hf[hf_id.lower()] = Entry(hf_id.split("/", 1)[1].lower(), hf_id, path)
    index: dict[str, Entry] = {}
    canonical: list[str] = []
    paired = {hf.lower(): slug for slug, hf in slugs.items()}
    for key, entry in by_hf.items():
        name = paired.get(key, entry.name)
        entry = Entry(name, entry.hf_id, entry.path)
        canonical.append(name)
        for k in {key, name, entry.name, entry.hf_id.replace("/", "--").lower()}:
            index[k] = entry
    for path in sorted(DATA.glob("*.json")):
        slug = path.stem
        if slug in index:
            continue  # the hf/ copy of the same model wins
        hf_id = (meta.get("hf_ids") or {}).get(slug, slug)
        entry = Entry(slug, hf_id, path)
        canonical.append(slug)
        index[slug] = entry
        index[hf_id.lower()] = entry
    for alias, target in (meta.get("aliases") or {}).items():
        spec = target if isinstance(target, dict) else {"target": target}
        base = index.get(str(spec["target"]).lower())
        if base is None:
            raise SpecError(DATA / "aliases.yaml", f"aliases.{alias}",
                            f"target {spec['target']!r} is not a file in {DATA}")
        index[alias.lower()] = Entry(base.name, base.hf_id, base.path,
                                     spec.get("weight_dtype") or base.weight_dtype)
    return index, tuple(sorted(canonical))


def list_architectures() -> list[str]:
    """Canonical names, one per config file under data/architectures/."""
    return list(_index()[1])


def resolve(name_or_hf_id_or_path: str) -> Entry:
    """Entry for a slug, HF id, alias or path; unknown names raise with the closest matches."""
    text = str(name_or_hf_id_or_path).strip()
    path = Path(text)
    index, canonical = _index()
    if text.endswith(".json") or path.is_file():
        if not path.is_file():
            raise ServecastError(f"{text}: no such config file")
        known = next((e for e in index.values() if e.path.resolve() == path.resolve()), None)
        if known is not None:  # a file of data/architectures/ keeps its canonical name
            return Entry(known.name, known.hf_id, known.path)
        twin = index.get(path.stem) if path.resolve().parent == DATA.resolve() else None
        if twin is not None:  # a <slug>.json whose hf/ copy is the canonical file
            return Entry(twin.name, twin.hf_id, path)
        # `<org>--<name>_config.json` names itself; a bare config.json is named by its folder
        stem = path.parent.name if path.name == "config.json" else path.stem
        hf_id = _hf_id(path) if path.name.endswith("_config.json") else stem
        return Entry(hf_id.split("/")[-1].lower(), hf_id, path)
    entry = index.get(text.lower())
    if entry is None:
        close = difflib.get_close_matches(text.lower(), list(index), n=5, cutoff=0.5)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        raise ServecastError(f"unknown architecture {text!r}{hint} (servecast arch list shows "
                             f"all {len(canonical)})")
    return entry


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(path, "file", f"cannot read: {err}") from None
    except json.JSONDecodeError as err:
        raise SpecError(path, "json", f"not valid JSON (line {err.lineno}: {err.msg})") from None
    if not isinstance(data, dict):
        raise SpecError(path, "json", "top level must be an object")
    return data


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a config: VL wrappers keep it under `text_config`."""
    inner = config.get("text_config")
    if not isinstance(inner, dict):
        return config
    merged = dict(inner)
    for key in ("tie_word_embeddings", "torch_dtype", "dtype", "quantization_config"):
        if key in config and key not in merged:
            merged[key] = config[key]
    return merged


def _quant(cfg: dict[str, Any], path: Path, weight_dtype: str | None) -> QuantScheme:
    if weight_dtype:
        return override(weight_dtype)
    sidecar = path.with_name(path.name.replace("_config.json", "_hf_quant_config.json"))
    hf_quant = _read_json(sidecar) if sidecar != path and sidecar.is_file() else None
    return parse_quant(cfg, hf_quant, str(path))


def _dominant_dtype(linears: list[Linear]) -> str:
    weight: dict[str, int] = {}
    for lin in linears:
        weight[lin.dtype] = weight.get(lin.dtype, 0) + lin.params
    return max(weight, key=weight.get) if weight else "bf16"


def build(config: dict[str, Any], path: Path, name: str, hf_id: str,
          weight_dtype: str | None = None) -> Architecture:
    """Normalize one config dict (already read) into an Architecture."""
    cfg = text_config(config)
    model_type = cfg.get("model_type") or config.get("model_type")
    if model_type in UNSUPPORTED:
        raise SpecError(path, "model_type", f"{model_type!r} unsupported: {UNSUPPORTED[model_type]}")
    if model_type not in FAMILIES:
        raise SpecError(path, "model_type",
                        f"{model_type!r} has no loader; supported: {', '.join(sorted(FAMILIES))}")
    family, builder = FAMILIES[model_type]
    b = Builder(cfg, str(path), model_type, _quant(cfg, path, weight_dtype))
    try:
        parts = builder(b)
    except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError, AttributeError) as err:
        # a field of the wrong shape (list too short, object where a number belongs, ...)
        raise SpecError(path, "config", f"malformed {family} config: {type(err).__name__}: "
                                        f"{err}") from None
    hidden, vocab = parts.hidden_size, parts.vocab_size
    unq = b.quant.unquantized if b.quant.method != "override" else "bf16"
    embed_name, head_name = parts.embedding_names
    embedding = Linear(embed_name, vocab, hidden, unq)
    lm_head = embedding if parts.tie_word_embeddings else Linear(
        head_name, hidden, vocab, b.quant.dtype_for(head_name, quantizable=False))
    non_expert = [p for layer in parts.layers if not layer.mtp
                  for p in layer.attention.projections + layer.mlp.projections]
    return Architecture(
        name=name, hf_id=hf_id, family=family, source=str(path), hidden_size=hidden,
        vocab_size=vocab, layers=parts.layers, embedding=embedding, lm_head=lm_head,
        tie_word_embeddings=parts.tie_word_embeddings, max_context=parts.max_context,
        weight_dtype=_dominant_dtype(non_expert), default_kv_dtype=parts.default_kv_dtype,
        hyper_connections=parts.hyper_connections)


def aliases_of(path: Path) -> tuple[str, ...]:
    """Every name in the index that resolves to the config at `path` (lower-cased)."""
    index, _ = _index()
    return tuple(sorted(k for k, e in index.items() if e.path == path))


@lru_cache(maxsize=256)
def _load(path: str, name: str, hf_id: str, weight_dtype: str | None) -> Architecture:
    arch = build(_read_json(Path(path)), Path(path), name, hf_id, weight_dtype)
    return replace(arch, aliases=aliases_of(Path(path)))


def load_architecture(name_or_hf_id_or_path: str, weight_dtype: str | None = None) -> Architecture:
    """The Architecture for a slug / HF id / alias / config path; `weight_dtype` overrides the
    checkpoint's precision for every quantizable Linear (embeddings, head, routers stay bf16)."""
    entry = resolve(name_or_hf_id_or_path)
    if weight_dtype is not None:
        weight_dtype = dtype(weight_dtype).name
    return _load(str(entry.path), entry.name, entry.hf_id, weight_dtype or entry.weight_dtype)


def within_window(arch: Architecture, tokens: int, what: str, allow_beyond: bool = False
                  ) -> str | None:
    """Refuse a context past the model's window (max_position_embeddings) naming `what` gave
    it, or with `allow_beyond` return the assumption to report (None when within)."""
    if not arch.max_context or tokens <= arch.max_context:
        return None
    if not allow_beyond:
        raise ServecastError(f"{what} = {tokens:,} tokens exceeds {arch.name}'s maximum context "
                             f"({arch.max_context:,} tokens, max_position_embeddings); allowed: "
                             f"0..{arch.max_context}, or --allow-beyond-window to extrapolate")
    return (f"{what} = {tokens:,} tokens is beyond {arch.name}'s window of "
            f"{arch.max_context:,}: extrapolated past what the model was built for")
