"""Weight precision of each module, read from a checkpoint's quantization config.

Checkpoints say which modules they quantize in four dialects: HF `fp8` / `mxfp4` with
`modules_to_not_convert`, `compressed-tensors` with `config_groups` + `ignore` (plain names,
globs, `re:` regexes), and NVIDIA ModelOpt (`hf_quant_config.json` or an inline
`quantization_config`) with `quant_algo`, `exclude_modules` and, for MIXED_PRECISION,
`quantized_layers` per module. All are reduced to one question: which dtype has module NAME?

Module names are compared after dropping the wrapper prefix before `layers.N.` (`model.`,
`model.language_model.`, `language_model.model.`, `backbone.`), so one rule set covers VL
wrappers. Embeddings, LM head and routers stay unquantized unless a rule names them.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from model.specs.dtypes import dtype as lookup_dtype
from model.specs.errors import SpecError

_LAYER = re.compile(r"(?:^|\.)((?:layers|mtp)\.\d+\..*)$")
_MODELOPT_ALGOS = {"FP8": "fp8", "NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4", "MXFP8": "mxfp8",
                   "MXFP4": "mxfp4", "W4A8_MXFP4_FP8": "mxfp4", "FP8_BLOCK": "fp8_block",
                   "W4A16_AWQ": "int4_group128", "W8A8_SQ_PER_CHANNEL": "int8"}


def _prefixes(norm: str) -> list[str]:
    """`a.b.c` -> [`a.b.c`, `a.b`, `a`]: the module and every module above it."""
    parts = norm.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _ancestors(per_module: dict[str, str]) -> dict[str, str]:
    """Every proper ancestor of a listed module -> that module's format (first listed wins)."""
    out: dict[str, str] = {}
    for name, fmt in per_module.items():
        for prefix in _prefixes(name)[1:]:
            out.setdefault(prefix, fmt)
    return out


def normalize(name: str) -> str:
    """`language_model.model.layers.3.mlp.gate` -> `layers.3.mlp.gate`; head and embeddings keep
    their last part."""
    match = _LAYER.search(name)
    if match:
        return match.group(1)
    return name.rsplit(".", 1)[-1] if name.endswith(("lm_head", "embed_tokens")) else name


@dataclass(frozen=True)
class QuantScheme:
    """Dtype per module name; `quantized` applies to every Linear no rule excludes."""

    quantized: str  # format of modules the checkpoint quantizes
    unquantized: str = "bf16"  # format of excluded modules (the checkpoint's torch_dtype)
    excluded_plain: frozenset[str] = frozenset()
    excluded_regex: re.Pattern | None = None
    per_module: dict[str, str] = field(default_factory=dict)  # normalized name prefix -> dtype
    kv_cache_dtype: str | None = None  # what the checkpoint calibrated its KV scales for
    method: str = "none"
    excluded_dtype: str | None = None  # MIXED_PRECISION: excluded modules keep the base format
    per_module_parents: dict[str, str] = field(default_factory=dict)  # ancestors of per_module

    def is_excluded(self, name: str) -> bool:
        norm = normalize(name)
        if any(part in self.excluded_plain for part in norm.split(".")):
            return True
        if any(prefix in self.excluded_plain for prefix in _prefixes(norm)):
            return True
        return bool(self.excluded_regex and self.excluded_regex.fullmatch(norm))

    def dtype_for(self, name: str, quantizable: bool = True) -> str:
        """Dtype of the Linear called `name` (normalized or full); routers etc. pass quantizable=False."""
        norm = normalize(name)
        if self.per_module:
            # exact module, a listed parent of it, or (coarser Linear) a listed child of it;
            # MIXED_PRECISION lists every quantized module, the rest keep the base format
            for prefix in _prefixes(norm):
                if prefix in self.per_module:
                    return self.per_module[prefix]
            child = self.per_module_parents.get(norm)
            if child:
                return child
        if not quantizable:
            return self.unquantized
        if self.is_excluded(norm):
            return self.excluded_dtype or self.unquantized
        return self.quantized


def _compile(patterns: list[str]) -> tuple[frozenset[str], re.Pattern | None]:
    """Bare names (`gate`, `lm_head`) match any path component; dotted names and globs match a
    module and everything below it; `re:` entries are regexes over the normalized name."""
    plain, regexes = set(), []
    for raw in patterns:
        if raw.startswith("re:"):
            regexes.append(raw[3:])
        elif "*" not in raw and "?" not in raw:
            plain.add(_glob_tail(raw))  # a bare name or a dotted module path
        else:
            glob = _glob_tail(raw)
            regexes.append(fnmatch.translate(glob)[4:-3] + r"(?:\..*)?")  # strip (?s: ...)\Z
    regex = re.compile("|".join(f"(?:{r})" for r in regexes)) if regexes else None
    return frozenset(plain), regex


def _glob_tail(raw: str) -> str:
    """Drop the wrapper prefix (`model.language_model.`) the way normalize() does."""
    match = re.search(r"(?:^|\.)((?:layers|mtp)\.[^.]*(?:\..*)?)$", raw)
    return match.group(1) if match else (raw.rsplit(".", 1)[-1] if raw.endswith(
        ("lm_head", "embed_tokens")) else raw)


def _fmt_bits(weights: dict, path: str, weight_only: bool = False) -> str:
    """Storage format of a compressed-tensors group; `weight_only`: the group quantizes no input
    activations, so MXFP4 weights meet BF16 activations (mxfp4_w4a16, BF16 tensor-core rate)."""
    bits, kind = weights.get("num_bits"), weights.get("type", "int")
    group = weights.get("group_size")
    if bits == 8:
        return "fp8" if kind == "float" else "int8"
    if bits == 4 and kind == "float":
        if group == 32:
            return "mxfp4_w4a16" if weight_only else "mxfp4"
        return "nvfp4"
    if bits == 4 and kind == "int":
        if group == 32:
            return _first_known(("int4_group32", "int4_group128"))
        return "int4_group128"
    raise SpecError(path, "quantization_config.config_groups.weights",
                    f"unsupported {bits}-bit {kind} group {group}; supported: 8-bit float/int, "
                    "4-bit float (group 16/32), 4-bit int")


def _first_known(names: tuple[str, ...]) -> str:
    for name in names:
        try:
            lookup_dtype(name)
            return name
        except Exception:  # noqa: BLE001 - a format model.specs.dtypes does not define yet
            continue
    return names[-1]


def _modelopt(q: dict, path: str, base: str, unquantized: str) -> QuantScheme:
    algo = q.get("quant_algo")
    kv = q.get("kv_cache_quant_algo")
    kv_dtype = _MODELOPT_ALGOS.get(kv) if kv else None
    excl = list(q.get("exclude_modules") or q.get("ignore") or [])
    plain, regex = _compile(excl)
    if algo == "MIXED_PRECISION":
        per: dict[str, str] = {}
        for name, spec in (q.get("quantized_layers") or {}).items():
            sub = spec.get("quant_algo")
            if sub not in _MODELOPT_ALGOS:
                raise SpecError(path, f"quantized_layers.{name}.quant_algo",
                                f"{sub!r} not supported; supported: {', '.join(_MODELOPT_ALGOS)}")
            norm = normalize(name)
            # one entry per expert (`experts.17.up_proj`) collapses to the experts module
            norm = re.sub(r"\.experts\.\d+\..*$", ".experts", norm)
            per[norm] = _MODELOPT_ALGOS[sub]
        return QuantScheme(base, unquantized, plain, regex, per, kv_dtype, "modelopt-mixed", base,
                           _ancestors(per))
    if algo not in _MODELOPT_ALGOS:
        raise SpecError(path, "quantization.quant_algo",
                        f"{algo!r} not supported; supported: {', '.join(_MODELOPT_ALGOS)}")
    return QuantScheme(_MODELOPT_ALGOS[algo], unquantized, plain, regex, {}, kv_dtype, "modelopt")


def parse_quant(config: dict, hf_quant: dict | None, path: str) -> QuantScheme:
    """QuantScheme from a (text) config dict and an optional `*_hf_quant_config.json` dict."""
    unquantized = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(
        config.get("torch_dtype") or config.get("dtype") or "bfloat16", "bf16")
    q = config.get("quantization_config")
    base = unquantized
    if q and q.get("quant_method") == "fp8":
        base = "fp8_block" if q.get("weight_block_size") else "fp8"
    if hf_quant and "quantization" in hf_quant:
        return _modelopt(hf_quant["quantization"], path, base, unquantized)
    if not q:
        return QuantScheme(unquantized, unquantized)
    method = q.get("quant_method")
    if q.get("producer", {}).get("name") == "modelopt" or method == "modelopt" or (
            "quant_algo" in q and method in (None, "fp8", "modelopt")):
        return _modelopt(q, path, base, unquantized)
    if method == "fp8":
        plain, regex = _compile(list(q.get("modules_to_not_convert") or []))
        return QuantScheme(base, unquantized, plain, regex, {}, None, "fp8")
    if method == "mxfp4":
        plain, regex = _compile(list(q.get("modules_to_not_convert") or []))
        return QuantScheme("mxfp4", unquantized, plain, regex, {}, None, "mxfp4")
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        if len(groups) != 1:
            raise SpecError(path, "quantization_config.config_groups",
                            f"{len(groups)} groups; supported: exactly one")
        group = next(iter(groups.values()))
        fmt = _fmt_bits(group.get("weights") or {}, path,
                        weight_only=group.get("input_activations") is None)
        plain, regex = _compile(list(q.get("ignore") or []))
        return QuantScheme(fmt, unquantized, plain, regex, {}, None, "compressed-tensors")
    raise SpecError(path, "quantization_config.quant_method",
                    f"{method!r} not supported; supported: fp8, mxfp4, compressed-tensors, modelopt")


def override(weight_dtype: str) -> QuantScheme:
    """Every quantizable Linear at `weight_dtype`; embeddings, head and routers stay bf16."""
    return QuantScheme(lookup_dtype(weight_dtype).name, "bf16", method="override")
