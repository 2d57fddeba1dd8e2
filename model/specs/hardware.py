"""Accelerator systems: one YAML per system under `hardware/`, every number with its source and date.

A spec file states each quantity in the unit its source uses, with provenance:

    hbm_bandwidth: {value: 8.0, unit: TB/s, source: S05, date: 2025-08, note: "..."}

The source ids resolve in `hardware/sources.yaml` (id -> title, url or method, accessed, kind),
which every chip shares; a spec file outside the repository may add its own `sources:` table.
Loading validates the file strictly (unknown or missing keys, numbers that YAML read as text,
units, plausible ranges, cited source ids, dense-rate ordering) and converts it to a frozen
`Hardware` in SI units whose field names carry their unit. `provenance` maps each `Hardware`
field to the sources behind it; `sources` holds the entries the spec cites.

Adding a chip is adding a file: copy a close one, keep every key (`HardwareFile` lists them; the
allowed units per key are in `UNITS`/`SCALARS`), cite each value, and state dense (non-sparse)
rates. A value no publication gives is still written, citing a source of `kind: assumption` whose
`method` says how it was derived; `Hardware.provenance[field].assumed` then flags it.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from model import ROOT
from model.specs.dtypes import dtype
from model.specs.errors import Infeasible, ServecastError, SpecError
from model.specs.specio import (
    ID,
    Source,
    Sourced,
    Strict,
    validated,
)

HARDWARE_DIR = ROOT / "hardware"
SOURCES_YAML = HARDWARE_DIR / "sources.yaml"
RATES = ("fp32", "bf16", "fp8", "fp4", "int8")
FP4_FORMATS = ("nvfp4", "mxfp4")
CALIBRATION_REFERENCES = ("h100_sxm", "h200_sxm", "b200_sxm")
STATUSES = ("shipping", "pre-release", "cloud-only")
SOURCE_KINDS = ("vendor", "third_party", "weak", "assumption")

# Units a file may use, by what they measure, with the factor to SI.
UNITS: dict[str, dict[str, float]] = {
    "flops": {"FLOP/s": 1.0, "TFLOP/s": 1e12, "PFLOP/s": 1e15, "TOP/s": 1e12, "POP/s": 1e15},
    "bytes": {"B": 1.0, "GB": 1e9, "TB": 1e12, "GiB": 2.0**30, "TiB": 2.0**40},
    "bytes_per_s": {"B/s": 1.0, "GB/s": 1e9, "TB/s": 1e12, "Gbit/s": 1e9 / 8, "Tbit/s": 1e12 / 8},
    "gpus": {"GPUs": 1.0},
    "watts": {"W": 1.0, "kW": 1e3},
    "usd_per_hour": {"USD/h": 1.0},
    "usd": {"USD": 1.0},
    "fraction": {"fraction": 1.0},
}

# file key -> (Hardware field, dimension, plausible SI range (inclusive)).
# Ranges are wide sanity bounds meant to catch unit slips (GB vs TB, bidirectional vs not).
SCALARS: dict[str, tuple[str, str, tuple[float, float]]] = {
    "hbm_capacity_usable": ("hbm_bytes", "bytes", (8e9, 2e12)),
    "hbm_capacity_nominal": ("hbm_bytes_nominal", "bytes", (8e9, 2e12)),
    "hbm_bandwidth": ("hbm_bandwidth_bytes_per_s", "bytes_per_s", (5e11, 1e14)),
    "scale_up_bandwidth_per_direction": ("scale_up_bandwidth_bytes_per_s", "bytes_per_s",
                                         (1e10, 2e13)),
    "scale_up_domain": ("scale_up_domain_gpus", "gpus", (1, 1e5)),
    "scale_out_bandwidth_per_direction": ("scale_out_bandwidth_bytes_per_s", "bytes_per_s",
                                          (1e9, 1e12)),
    "host_memory_per_gpu": ("host_memory_bytes_per_gpu", "bytes", (1e10, 1e13)),
    "host_link_bandwidth_per_direction": ("host_link_bandwidth_bytes_per_s", "bytes_per_s",
                                          (1e9, 1e13)),
    "nvme_capacity_per_gpu": ("nvme_bytes_per_gpu", "bytes", (0.0, 1e14)),  # 0: no local NVMe
    "nvme_bandwidth_per_gpu": ("nvme_bandwidth_bytes_per_s_per_gpu", "bytes_per_s", (0.0, 1e11)),
    "power_tdp": ("power_w", "watts", (100.0, 5000.0)),
    "power_all_in": ("power_all_in_w", "watts", (100.0, 10000.0)),
    "tco_owned_per_gpu_hour": ("tco_usd_per_gpu_hour", "usd_per_hour", (0.1, 50.0)),
    "capex_per_gpu": ("capex_usd_per_gpu", "usd", (1e3, 1e6)),
}
PEAK_RANGE = (1e12, 1e17)  # FLOP/s, dense, one GPU package
MAMF_RANGE = (0.05, 1.0)
RENTAL_RANGE = (0.1, 100.0)  # USD per GPU-hour

class Quantity(Sourced):
    value: float


class Span(Sourced):
    low: float
    high: float


class CalibrationReference(Strict):
    value: Literal["h100_sxm", "h200_sxm", "b200_sxm"]
    reason: str


class KernelTables(Strict):
    """Measured op tables of this chip's die that take precedence over the transfer from
    `calibration_reference` for the op classes they time (data/calibration/ops/<value>/)."""

    value: Literal["cdna3_304cu"]
    reason: str


class HardwareFile(Strict):
    """The on-disk schema of `hardware/<name>.yaml`."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    aliases: list[str]
    vendor: str
    system: str
    status: Literal["shipping", "pre-release", "cloud-only"]
    calibration_reference: CalibrationReference
    kernel_tables: KernelTables | None = None
    peak_flops: dict[Literal["fp32", "bf16", "fp8", "fp4", "int8"], Quantity]
    fp4_formats: list[Literal["nvfp4", "mxfp4"]]
    hbm_capacity_usable: Quantity
    hbm_capacity_nominal: Quantity
    hbm_bandwidth: Quantity
    scale_up_bandwidth_per_direction: Quantity
    scale_up_domain: Quantity
    scale_out_bandwidth_per_direction: Quantity
    host_memory_per_gpu: Quantity
    host_link_bandwidth_per_direction: Quantity
    nvme_capacity_per_gpu: Quantity
    nvme_bandwidth_per_gpu: Quantity
    power_tdp: Quantity
    power_all_in: Quantity
    tco_owned_per_gpu_hour: Quantity
    rental_per_gpu_hour: Span
    capex_per_gpu: Quantity
    mamf_efficiency: dict[Literal["fp32", "bf16", "fp8", "fp4", "int8"], Quantity]
    notes: list[str] = []
    sources: dict[Annotated[str, Field(pattern=ID)], Source] = {}  # beyond hardware/sources.yaml


class SourcesFile(Strict):
    """The on-disk schema of `hardware/sources.yaml`."""

    sources: dict[Annotated[str, Field(pattern=ID)], Source]


class FieldSource(BaseModel):
    """Where one `Hardware` value comes from."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    sources: tuple[str, ...]
    date: str
    note: str | None = None
    assumed: bool  # True when any cited source is a Servecast assumption, not a publication


class Hardware(BaseModel):
    """One accelerator (per GPU package) in its system, SI units; dense peaks (no 2:4 sparsity)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    aliases: tuple[str, ...]
    vendor: str
    system: str
    status: str
    peak_flops_per_s: dict[str, float]
    fp4_formats: tuple[str, ...]
    hbm_bytes: float  # usable
    hbm_bytes_nominal: float
    hbm_bandwidth_bytes_per_s: float
    scale_up_bandwidth_bytes_per_s: float  # per GPU per direction
    scale_up_domain_gpus: int
    scale_out_bandwidth_bytes_per_s: float  # per GPU per direction
    host_memory_bytes_per_gpu: float
    host_link_bandwidth_bytes_per_s: float  # per direction
    nvme_bytes_per_gpu: float
    nvme_bandwidth_bytes_per_s_per_gpu: float
    power_w: float  # GPU TDP / TBP
    power_all_in_w: float  # chip + share of host, NICs, switches (SemiAnalysis), before PUE
    tco_usd_per_gpu_hour: float  # owned, all-in
    rental_usd_per_gpu_hour: tuple[float, float]
    capex_usd_per_gpu: float
    mamf_efficiency: dict[str, float]
    calibration_reference: str
    calibration_reason: str
    kernel_tables: str
    notes: tuple[str, ...]
    sources: dict[str, Source]
    provenance: dict[str, FieldSource]
    path: str

    def __hash__(self) -> int:  # dict fields are unhashable; a spec is identified by its file
        return hash((self.name, self.path))

    def peak(self, rate: str) -> float:
        """Dense peak FLOP/s at a rate key (fp32 bf16 fp8 fp4 int8) or a dtype name (nvfp4, ...).

        Raises Infeasible when the chip has no such rate, or lacks that fp4 format (MI355X: no
        NVFP4)."""
        key = rate.lower()
        if key not in RATES:
            fmt = dtype(key)
            if fmt.rate == "fp4" and fmt.name not in self.fp4_formats:
                raise Infeasible(f"{self.name} does not support {fmt.name}; fp4 formats: "
                                 f"{', '.join(self.fp4_formats) or 'none'}")
            key = fmt.rate
        if key not in self.peak_flops_per_s:
            raise Infeasible(f"{self.name} has no {key} tensor rate; available: "
                             f"{', '.join(self.peak_flops_per_s)}")
        return self.peak_flops_per_s[key]

    @property
    def ridge_flop_per_byte(self) -> float:
        """BF16 roofline ridge point: FLOP per HBM byte where compute and memory time are equal."""
        return self.peak("bf16") / self.hbm_bandwidth_bytes_per_s


# ---------------------------------------------------------------------------------------------
# File -> Hardware


def _cited_ids(path: Path, key: str, source: list[str], table: dict[str, Source]) -> tuple:
    ids = tuple(source)
    if not ids:
        raise SpecError(path, f"{key}.source", "empty; cite at least one id of the sources table")
    for sid in ids:
        if sid not in table:
            raise SpecError(path, f"{key}.source", f"{sid!r} is not in the sources table "
                            f"({SOURCES_YAML.name} or the file's own); "
                            f"allowed: {', '.join(table)}")
    return ids


def _si(path: Path, key: str, q: Quantity | Span, dimension: str,
        bounds: tuple[float, float], attr: str = "value") -> float:
    units = UNITS[dimension]
    if q.unit not in units:
        raise SpecError(path, f"{key}.unit", f"{q.unit!r} is not allowed here; allowed: "
                        f"{', '.join(units)}")
    raw = getattr(q, attr)
    value = raw * units[q.unit]
    low, high = bounds
    if not math.isfinite(value) or not low <= value <= high:
        lo_u, hi_u = low / units[q.unit], high / units[q.unit]
        raise SpecError(path, f"{key}.{attr}", f"{raw:g} {q.unit} is out of range; allowed "
                        f"{lo_u:g} to {hi_u:g} {q.unit}")
    return value


def _provenance(path: Path, key: str, q: Quantity | Span, table: dict[str, Source]) -> FieldSource:
    ids = _cited_ids(path, key, q.source, table)
    return FieldSource(sources=ids, date=q.date, note=q.note,
                       assumed=any(table[i].kind == "assumption" for i in ids))


def _checked_sources(path: Path, table: dict[str, Source]) -> dict[str, Source]:
    """`table`, each entry with a public URL or a stated method."""
    for sid, source in table.items():
        if not (source.url or source.method):
            raise SpecError(path, f"sources.{sid}", "needs a url, or a method saying how the "
                            "figure was obtained")
    return table


@functools.lru_cache(maxsize=1)
def shared_sources() -> dict[str, Source]:
    """The sources every chip spec cites: `hardware/sources.yaml`."""
    return _checked_sources(SOURCES_YAML, validated(SOURCES_YAML, SourcesFile).sources)


def _source_table(path: Path, spec: HardwareFile) -> dict[str, Source]:
    shared = shared_sources()
    for sid in spec.sources:
        if sid in shared:
            raise SpecError(path, f"sources.{sid}", f"already defined in {SOURCES_YAML}; cite it "
                            "without redefining it")
    return {**shared, **_checked_sources(path, spec.sources)}


def _cited(provenance: dict[str, FieldSource], notes: tuple[str, ...],
           table: dict[str, Source]) -> dict[str, Source]:
    """The entries of `table` that some value cites, or a note names as [id], in table order."""
    cited = {sid for where in provenance.values() for sid in where.sources}
    texts = [where.note or "" for where in provenance.values()] + list(notes)
    cited |= {sid for text in texts for sid in re.findall(r"\[([A-Za-z0-9][\w-]*)\]", text)}
    return {sid: source for sid, source in table.items() if sid in cited}


def _build(path: Path, spec: HardwareFile) -> Hardware:
    table = _source_table(path, spec)
    values: dict[str, Any] = {}
    provenance: dict[str, FieldSource] = {}

    for key, (field, dimension, bounds) in SCALARS.items():
        q: Quantity = getattr(spec, key)
        values[field] = _si(path, key, q, dimension, bounds)
        provenance[field] = _provenance(path, key, q, table)
    if (values["nvme_bytes_per_gpu"] > 0) != (values["nvme_bandwidth_bytes_per_s_per_gpu"] > 0):
        key = "nvme_bandwidth_per_gpu" if values["nvme_bytes_per_gpu"] > 0 else \
            "nvme_capacity_per_gpu"
        raise SpecError(path, f"{key}.value", "0 while the other NVMe figure is not: a local "
                        "NVMe tier needs both a capacity and a bandwidth; allowed: both > 0, or "
                        "both 0 (no local NVMe)")
    if not float(values["scale_up_domain_gpus"]).is_integer():
        raise SpecError(path, "scale_up_domain.value", "must be a whole number of GPUs")
    values["scale_up_domain_gpus"] = int(values["scale_up_domain_gpus"])

    peaks: dict[str, float] = {}
    for rate in RATES:  # keep a fixed order
        if rate in spec.peak_flops:
            q = spec.peak_flops[rate]
            peaks[rate] = _si(path, f"peak_flops.{rate}", q, "flops", PEAK_RANGE)
            provenance[f"peak_flops_per_s.{rate}"] = _provenance(path, f"peak_flops.{rate}", q,
                                                                 table)
    for needed in ("bf16", "fp8"):
        if needed not in peaks:
            raise SpecError(path, f"peak_flops.{needed}", "missing; every system states its "
                            "dense bf16 and fp8 rates (fp8 = bf16 rate where there is no speed-up)")
    for low, high in (("bf16", "fp8"), ("fp8", "fp4")):
        if low in peaks and high in peaks and peaks[high] < peaks[low]:
            raise SpecError(path, f"peak_flops.{high}", f"dense {high} rate {peaks[high]:.4g} "
                            f"FLOP/s is below the {low} rate {peaks[low]:.4g}; check dense vs "
                            f"sparse figures")
    if ("fp4" in peaks) != bool(spec.fp4_formats):
        raise SpecError(path, "fp4_formats", "list the fp4 formats (nvfp4, mxfp4) exactly when "
                        "peak_flops has fp4")

    mamf: dict[str, float] = {}
    for rate, q in spec.mamf_efficiency.items():
        if rate not in peaks:
            raise SpecError(path, f"mamf_efficiency.{rate}", f"no peak_flops.{rate} to be a "
                            f"fraction of; allowed: {', '.join(peaks)}")
        mamf[rate] = _si(path, f"mamf_efficiency.{rate}", q, "fraction", MAMF_RANGE)
        provenance[f"mamf_efficiency.{rate}"] = _provenance(path, f"mamf_efficiency.{rate}", q,
                                                            table)

    rent = spec.rental_per_gpu_hour
    low = _si(path, "rental_per_gpu_hour", rent, "usd_per_hour", RENTAL_RANGE, "low")
    high = _si(path, "rental_per_gpu_hour", rent, "usd_per_hour", RENTAL_RANGE, "high")
    if high < low:
        raise SpecError(path, "rental_per_gpu_hour.high", f"{high:g} is below low {low:g}")
    provenance["rental_usd_per_gpu_hour"] = _provenance(path, "rental_per_gpu_hour", rent, table)

    if values["hbm_bytes"] > values["hbm_bytes_nominal"] * (1 + 1e-9):
        raise SpecError(path, "hbm_capacity_usable.value", "exceeds hbm_capacity_nominal")
    if values["power_all_in_w"] < values["power_w"]:
        raise SpecError(path, "power_all_in.value", "all-in power per GPU is below the GPU's "
                        "own power_tdp")

    return Hardware(
        name=spec.name, aliases=tuple(spec.aliases), vendor=spec.vendor, system=spec.system,
        status=spec.status, peak_flops_per_s=peaks, fp4_formats=tuple(spec.fp4_formats),
        rental_usd_per_gpu_hour=(low, high), mamf_efficiency=mamf,
        calibration_reference=spec.calibration_reference.value,
        calibration_reason=spec.calibration_reference.reason,
        kernel_tables=spec.kernel_tables.value if spec.kernel_tables else "",
        notes=tuple(spec.notes),
        sources=_cited(provenance, tuple(spec.notes), table), provenance=provenance,
        path=str(path), **values)


@functools.lru_cache(maxsize=256)
def _load_file(path_text: str) -> Hardware:
    path = Path(path_text)
    return _build(path, validated(path, HardwareFile))


def _normalize(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


@functools.lru_cache(maxsize=1)
def _index() -> dict[str, Path]:
    """Normalized name or alias -> file, over `hardware/*.yaml`."""
    index: dict[str, Path] = {}
    for path in sorted(HARDWARE_DIR.glob("*.yaml")):
        if path == SOURCES_YAML:
            continue
        hw = _load_file(str(path))
        if hw.name != path.stem:
            raise SpecError(path, "name", f"{hw.name!r} must equal the file name {path.stem!r}")
        for label in (hw.name, *hw.aliases):
            key = _normalize(label)
            if key in index and index[key] != path:
                raise SpecError(path, "aliases", f"{label!r} is also claimed by {index[key]}")
            index[key] = path
    return index


def list_hardware() -> list[str]:
    """Names of all systems under `hardware/`."""
    return sorted({p.stem for p in _index().values()})


def _looks_like_path(text: str) -> bool:
    return text.endswith((".yaml", ".yml")) or "/" in text or "\\" in text


@functools.lru_cache(maxsize=256)
def load_hardware(name_or_alias_or_path: str | Path) -> Hardware:
    """A system by name or alias (case-insensitive, `_`/`-` alike) or a path to a spec YAML."""
    text = str(name_or_alias_or_path)
    if isinstance(name_or_alias_or_path, Path) or _looks_like_path(text):
        return _load_file(str(Path(text).expanduser().resolve()))
    index = _index()
    key = _normalize(text)
    if key not in index:
        raise ServecastError(f"unknown hardware {text!r}; allowed: {', '.join(list_hardware())} "
                             f"(or aliases of them, or a path to a .yaml spec)")
    return _load_file(str(index[key]))
