"""Deployment recipes: how a model family is served (weight precision, KV-cache dtype, speculative
decoding), as data in data/deployments/*.yaml with sources. `plan` fills what the caller leaves
unset from the recipe, so a deployment's serving format is an input of record, never a per-row
factor."""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from model import ROOT
from model.specs.errors import SpecError
from model.specs.specio import load_yaml

RECIPES_DIR = ROOT / "data" / "deployments"


class Fp4Variant(BaseModel):
    """How the family is served on chips with native FP4 tensor cores (a hardware spec's
    `fp4_formats` lists `format`): another checkpoint, quantized in part (model.specs.precision)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["nvfp4", "mxfp4"]
    checkpoint: str
    precision: str
    source: str
    # a draft served with this checkpoint instead of the recipe's, and its acceptance length
    spec_draft_model: str | None = None
    acceptance_length: float | None = Field(None, ge=1.0, le=17.0)
    spec_source: str | None = None

    @model_validator(mode="after")
    def _draft_sourced(self) -> Fp4Variant:
        if (self.spec_draft_model is None) != (self.acceptance_length is None) or \
                (self.spec_draft_model is not None and not self.spec_source):
            raise ValueError("spec_draft_model, acceptance_length and spec_source go together")
        return self


class MxFallback(BaseModel):
    """How the family's MX checkpoint runs on one vendor's chips without MX tensor cores (a
    hardware spec whose `fp4_formats` lacks mxfp4): the engine's software path, as a precision."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vendor: Literal["NVIDIA", "AMD"]
    precision: str
    source: str


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    family: str
    architectures: tuple[str, ...]
    precision: str | None = None
    precision_source: str
    # the checkpoint that holds `precision` when it is not the architecture's own HF id
    checkpoint: str | None = None
    kv_dtype: str | None = None
    kv_dtype_source: str
    spec_method: Literal["none", "mtp", "eagle3", "dspark"] = "none"
    spec_tokens: int = Field(0, ge=0, le=16)  # vLLM num_speculative_tokens
    # measured mean tokens per verification step (1 + accepted drafts), <= 1 + spec_tokens
    acceptance_length: float = Field(1.0, ge=1.0, le=17.0)
    spec_source: str
    spec_draft_model: str | None = None  # external draft checkpoint (eagle3, dspark)
    vllm_args: tuple[str, ...] = ()  # further sourced `vllm serve` flags of the format
    fp4: Fp4Variant | None = None
    mx_fallback: tuple[MxFallback, ...] = ()
    date: str

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        if (self.spec_method == "none") != (self.spec_tokens == 0):
            raise ValueError("spec_method none goes with spec_tokens 0 and vice versa")
        for al in (self.acceptance_length, self.fp4.acceptance_length if self.fp4 else None):
            if al is not None and al > 1.0 + self.spec_tokens:
                raise ValueError(f"acceptance_length {al} exceeds 1 + spec_tokens "
                                 f"({1 + self.spec_tokens})")
        return self

    def spec_on(self, hw=None) -> tuple[int, float, str]:
        """(draft tokens, acceptance length, method) as the step model takes them, with the
        FP4 variant's draft on chips that serve it."""
        al = self._served(hw, "acceptance_length")
        return (self.spec_tokens, al if self.spec_tokens else 0.0,
                self.spec_method if self.spec_tokens else "mtp")

    @property
    def spec(self) -> tuple[int, float, str]:
        return self.spec_on()

    def draft_on(self, hw=None) -> str | None:
        """The external draft checkpoint served on chip `hw` (None: the checkpoint's own)."""
        return self._served(hw, "spec_draft_model")

    def _served(self, hw, field: str):
        """`field` of the FP4 variant served on chip `hw` where it sets one, else the recipe's."""
        value = getattr(self.fp4_on(hw), field, None)
        return value if value is not None else getattr(self, field)

    def fp4_on(self, hw) -> Fp4Variant | None:
        """The FP4 variant when chip `hw` has its format (None: no variant, or unknown chip)."""
        formats = tuple(getattr(hw, "fp4_formats", ()) or ())
        return self.fp4 if self.fp4 is not None and self.fp4.format in formats else None

    def holds(self, hw, precision) -> bool:
        """Whether `precision` is how the recipe's checkpoint on chip `hw` is served: its
        precision there, or (without an FP4 variant) the checkpoint's own format."""
        return precision == self.precision_on(hw) or (
            self.fp4_on(hw) is None and precision == self.precision)

    def checkpoint_on(self, hw) -> str | None:
        """The checkpoint served on chip `hw` when it is not the architecture's own (None)."""
        variant = self.fp4_on(hw)
        return variant.checkpoint if variant else self.checkpoint

    def precision_on(self, hw) -> str | None:
        """The served precision on chip `hw`: the FP4 variant's, else the MX fallback of the
        chip's vendor where it has no MX tensor cores, else the recipe's."""
        if self.fp4_on(hw) is None and hw is not None and \
                "mxfp4" not in tuple(getattr(hw, "fp4_formats", ()) or ()):
            for fallback in self.mx_fallback:
                if fallback.vendor == getattr(hw, "vendor", None):
                    return fallback.precision
        return self._served(hw, "precision")

    def assumptions(self, hw=None) -> str:
        draft = self.draft_on(hw)
        spec = "off" if self.spec_tokens == 0 else (
            f"{self.spec_method} {self.spec_tokens} tokens" + (f" ({draft})" if draft else "")
            + f", acceptance length {self.spec_on(hw)[1]:g}")
        variant = self.fp4_on(hw)
        served = self.precision_on(hw)
        precision = (f"{variant.precision} ({variant.checkpoint} on {variant.format} chips)"
                     if variant else served if served == self.precision
                     else f"{served} (no MX tensor cores on this chip)")
        return (f"recipe {self.family}: weights {precision or 'as checkpoint'}, KV "
                f"{self.kv_dtype or 'checkpoint dtype'}, speculative decoding {spec} "
                f"(data/deployments/{self.family}.yaml)")


@cache
def load_recipes() -> tuple[Recipe, ...]:
    out = []
    for path in sorted(RECIPES_DIR.glob("*.yaml")):
        data = load_yaml(path.read_text())
        if isinstance(data, dict) and "date" in data:
            data["date"] = str(data["date"])  # YAML reads 2026-11-29 as a date
        try:
            out.append(Recipe.model_validate(data))
        except ValidationError as err:
            e = err.errors()[0]
            raise SpecError(str(path), ".".join(str(p) for p in e["loc"]) or "-", e["msg"]) from None
    return tuple(out)


def recipe_for(arch_name: str) -> Recipe | None:
    """The recipe listing `arch_name` (exact slug), else None (serve the checkpoint as is)."""
    for r in load_recipes():
        if arch_name in r.architectures:
            return r
    return None


SPEC_OFF = (0, 0.0, "mtp")  # (draft tokens, acceptance length, method): no speculative decoding


def recipe_settings(arch_name: str, precision: str | None = None, kv_dtype: str | None = None,
                    speculative: bool = True, hw=None
                    ) -> tuple[str | None, str | None, tuple | None]:
    """(precision, KV dtype, speculative setting) with the unset ones from the family's recipe
    as served on chip `hw` (its FP4 variant where the chip has the format); the speculative
    setting is the recipe's (SPEC_OFF without `speculative`), None when the family has no
    recipe."""
    r = recipe_for(arch_name) if arch_name else None
    if r is None:
        return precision, kv_dtype, None
    return (precision if precision is not None else r.precision_on(hw),
            kv_dtype if kv_dtype is not None else r.kv_dtype,
            r.spec_on(hw) if speculative else SPEC_OFF)


def acceptance_for_tokens(tokens: int, acceptance_length: float, k: int) -> float:
    """Acceptance length with `k` draft tokens, from a measured one with `tokens` drafts, when
    each draft position is accepted with the same probability p given the previous ones
    (AL(n) = 1 + p + ... + p^n, p solved from the measured point): the standard i.i.d.
    acceptance model of speculative decoding (Leviathan et al. 2023, eq. 1). Used where a
    deployment drafts fewer tokens than its recipe's golden acceptance length was measured at."""
    from scipy.optimize import brentq  # scipy only here: kept off the spec loaders' import path

    if k <= 0 or tokens <= 0:
        return 1.0
    if not 1.0 <= acceptance_length <= 1.0 + tokens:
        raise SpecError("recipe", "acceptance_length",
                        f"{acceptance_length:g} must lie in [1, 1 + {tokens}]")
    if acceptance_length >= 1.0 + tokens - 1e-12:
        return 1.0 + k
    if acceptance_length <= 1.0 + 1e-12:
        return 1.0
    p = brentq(lambda q: sum(q**i for i in range(tokens + 1)) - acceptance_length, 0.0, 1.0)
    return float(sum(p**i for i in range(k + 1)))
