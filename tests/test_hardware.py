"""Hardware specs: every file loads and is consistent; values match their cited sources; names and
aliases resolve; malformed files fail with one line naming file and key (also through the CLI)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
import yaml

from model.specs.errors import Infeasible, ServecastError, SpecError
from model.specs.hardware import (
    HARDWARE_DIR,
    SOURCES_YAML,
    Hardware,
    list_hardware,
    load_hardware,
    shared_sources,
)

# The systems the design names (DESIGN.md "Names").
REQUIRED = ["h100-sxm", "h200-sxm", "b200", "b300", "gb200-nvl72", "gb300-nvl72", "mi300x",
            "mi325x", "mi355x"]
ALL = list_hardware()
NUMERIC_FIELDS = [name for name, field in Hardware.model_fields.items()
                  if field.annotation in (float, int)]


def servecast(*args: str) -> subprocess.CompletedProcess:
    """Run the CLI entry point (`model.frontends.cli:main`, the `servecast` script) in a subprocess."""
    code = "import sys; from model.frontends.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120)


def test_at_least_twelve_systems_including_the_required_ones():
    assert len(ALL) >= 12
    assert set(REQUIRED) <= set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_spec_invariants(name):
    hw = load_hardware(name)
    peaks = hw.peak_flops_per_s
    # Dense rates are ordered bf16 <= fp8 <= fp4 on every chip (TPU v6e: fp8 = bf16).
    assert peaks["fp8"] >= peaks["bf16"]
    if "fp4" in peaks:
        assert peaks["fp4"] >= peaks["fp8"]
        assert hw.fp4_formats
    # One package: 16 GB (TPU v6e has 32) to 1 TB of HBM, usable <= nominal.
    assert 16e9 <= hw.hbm_bytes <= hw.hbm_bytes_nominal <= 1e12
    # bf16 ridge points of real accelerators lie between ~100 and ~1000 FLOP/byte.
    assert 100 < hw.ridge_flop_per_byte < 1000
    # Scale-up fabrics are faster than the per-GPU NIC; HBM is faster than both.
    assert hw.scale_out_bandwidth_bytes_per_s < hw.scale_up_bandwidth_bytes_per_s
    assert hw.scale_up_bandwidth_bytes_per_s < hw.hbm_bandwidth_bytes_per_s
    assert hw.power_w <= hw.power_all_in_w
    low, high = hw.rental_usd_per_gpu_hour
    assert 0 < low <= high
    # An owner's cost sits below the dearest market rental.
    assert hw.tco_usd_per_gpu_hour <= high
    assert all(0 < f <= 1 for f in hw.mamf_efficiency.values())
    assert set(hw.mamf_efficiency) <= set(peaks)
    assert hw.calibration_reference in ("h100_sxm", "h200_sxm", "b200_sxm")
    assert hw.calibration_reason


@pytest.mark.parametrize("name", ALL)
def test_every_value_is_sourced_and_dated(name):
    hw = load_hardware(name)
    expected = set(NUMERIC_FIELDS) | {"rental_usd_per_gpu_hour"}
    expected |= {f"peak_flops_per_s.{r}" for r in hw.peak_flops_per_s}
    expected |= {f"mamf_efficiency.{r}" for r in hw.mamf_efficiency}
    assert set(hw.provenance) == expected
    for where in hw.provenance.values():
        assert where.sources and where.date[:2] == "20"
        assert all(sid in hw.sources for sid in where.sources)
    # Compute and memory come from publications, never from a Servecast assumption.
    for key in ("hbm_bandwidth_bytes_per_s", *(f"peak_flops_per_s.{r}" for r in ("bf16", "fp8"))):
        assert not hw.provenance[key].assumed, key


def _cited_ids(text: str) -> set[str]:
    """Source ids a spec file cites: `source:` fields and [S..] / [A-..] references in notes."""
    ids = set()
    for one, many in re.findall(r"source: (?:([\w-]+)|\[([^\]]*)\])", text):
        ids |= {one} if one else {i.strip() for i in many.split(",")}
    return ids | set(re.findall(r"\[((?:S|A-)[\w-]*)\]", text))


def test_every_cited_source_resolves_inside_the_repository():
    table = shared_sources()
    cited = set()
    for path in sorted(HARDWARE_DIR.glob("*.yaml")):
        if path == SOURCES_YAML:
            continue
        text = path.read_text()
        ids = _cited_ids(text)
        assert ids <= set(table), (path.name, ids - set(table))
        assert "sources" not in yaml.safe_load(text), path.name  # one shared table
        cited |= ids
    # every entry is cited by some chip, and has a public URL or says how the figure was obtained
    assert set(table) == cited
    for sid, source in table.items():
        assert (source.url or "").startswith("https://") or len(source.method or "") > 40, sid
        assert (source.kind == "assumption") == sid.startswith("A-"), sid
    # nothing under hardware/ points outside the repository
    for path in HARDWARE_DIR.glob("*.yaml"):
        assert not re.search(r"/work/|\.\./shared|research/\w+\.(md|csv)", path.read_text()), \
            path.name


def test_sources_hold_what_values_and_notes_cite():
    h100 = load_hardware("h100-sxm")
    # capex cites [S39, S50]; its note names [S38]; the NCCL note names [S46]
    assert {"S39", "S50", "S38", "S46"} <= set(h100.sources)
    assert "S05" not in h100.sources  # a B200-era source no H100 value cites


def test_values_match_cited_figures():
    h100 = load_hardware("h100-sxm")
    # H100 datasheet: 1,979 TFLOPS bf16 "shown with sparsity", dense is half [S02]; ml-engineering
    # table 989 [S03].
    assert h100.peak("bf16") == pytest.approx(1979e12 / 2, rel=1e-3)
    assert h100.hbm_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    # NVLink 4: 900 GB/s bidirectional -> 450 GB/s per direction.
    assert h100.scale_up_bandwidth_bytes_per_s == pytest.approx(900e9 / 2)
    # DGX B200 user guide [S04]: 8 GPUs "provide 1,440 GB total GPU memory" (180 per GPU, in the
    # binary units DRAM is sold in); nvidia-smi reports 183,359 MiB per B200 [S-smi].
    assert load_hardware("b200").hbm_bytes == pytest.approx(183_359 * 2**20, rel=2e-4)
    assert load_hardware("b200").hbm_bytes == pytest.approx(1440 / 8 * 2**30, rel=0.01)
    # B300 SXM6 AC: nvidia-smi 275,040 MiB [S-smi]
    assert load_hardware("b300").hbm_bytes == pytest.approx(275_040 * 2**20, rel=2e-4)
    # GB300 NVL72 rack: 1,080 PF dense NVFP4 over 72 GPUs [S05][S11].
    assert load_hardware("gb300").peak("fp4") == pytest.approx(1080e15 / 72)
    # MI300X: 2,100 MHz x 1,216 matrix cores x 256 FMA/clk x 2 FLOP = 1,307.4 TF bf16 [S03].
    assert load_hardware("mi300x").peak("bf16") == pytest.approx(2100e6 * 1216 * 256 * 2,
                                                                  rel=1e-4)
    # TPU7x HBM is 192 GiB [S26].
    assert load_hardware("tpu7x").hbm_bytes == 192 * 2**30
    # B300: ConnectX-8, 800 Gb/s per GPU = 100 GB/s per direction [S10].
    assert load_hardware("b300").scale_out_bandwidth_bytes_per_s == pytest.approx(100e9)


def test_tco_matches_the_vllm_agentx_seed():
    # Seed post: DeepSeek V4 Pro on 12 GB300 = $27.72/h, Kimi K3 on 16 GB300 = $36.96/h,
    # MiniMax M3 on 2 B300 = $4.52/h; the SemiAnalysis Jul-2026 owned tier gives the same [S28].
    gb300, b300 = load_hardware("gb300-nvl72"), load_hardware("b300")
    assert 12 * gb300.tco_usd_per_gpu_hour == pytest.approx(27.72)
    assert 16 * gb300.tco_usd_per_gpu_hour == pytest.approx(36.96)
    assert 2 * b300.tco_usd_per_gpu_hour == pytest.approx(4.52)


@pytest.mark.parametrize("alias, name", [
    ("h100_sxm", "h100-sxm"), ("H100-SXM", "h100-sxm"), ("h200_sxm", "h200-sxm"),
    ("b200_sxm", "b200"), ("b300_sxm", "b300"), ("gb200", "gb200-nvl72"),
    ("gb300", "gb300-nvl72"), ("GB300_NVL72", "gb300-nvl72"), (" MI355X ", "mi355x"),
    ("ironwood", "tpu7x"), ("vr200", "vera-rubin-nvl72"),
])
def test_names_and_aliases_resolve(alias, name):
    assert load_hardware(alias).name == name


def test_a_path_loads_and_unknown_names_list_the_allowed_ones():
    assert load_hardware(HARDWARE_DIR / "b200.yaml").name == "b200"
    assert load_hardware(str(HARDWARE_DIR / "b200.yaml")) == load_hardware("b200")
    with pytest.raises(ServecastError, match="allowed: b200, b300, gb200-nvl72"):
        load_hardware("h800")


def test_loads_are_cached_and_specs_hashable():
    assert load_hardware("gb300") is load_hardware("gb300")
    assert len({load_hardware("b200"), load_hardware("b200_sxm"), load_hardware("b300")}) == 2


def test_peak_by_rate_and_format():
    mi355x = load_hardware("mi355x")
    assert mi355x.peak("mxfp4") == pytest.approx(10.1e15)  # MXFP4 dense [S03]
    with pytest.raises(Infeasible, match="does not support nvfp4"):
        mi355x.peak("nvfp4")  # CDNA4 has MXFP4/MXFP6 only
    h100 = load_hardware("h100-sxm")
    assert h100.peak("fp8_block") == h100.peak("fp8")
    with pytest.raises(Infeasible, match="no fp4 tensor rate"):
        h100.peak("fp4")


# --- malformed files --------------------------------------------------------------------------

BASE = (HARDWARE_DIR / "h100-sxm.yaml").read_text()


def _mutated(change) -> str:
    data = yaml.safe_load(BASE)
    change(data)
    return yaml.safe_dump(data, sort_keys=False)


MALFORMED = {
    "bad_yaml": ("name: [h100\n", "yaml", "not valid YAML"),
    "missing_key": (_mutated(lambda d: d.pop("hbm_bandwidth")), "hbm_bandwidth",
                    "missing"),
    "unknown_key": (_mutated(lambda d: d.update(hbm_speed=3)), "hbm_speed",
                    "unknown key; allowed keys: name, aliases"),
    # PyYAML reads 3.35e12 (no sign in the exponent) as text.
    "number_as_string": (BASE.replace("value: 3.35, unit: TB/s", "value: 3.35e12, unit: B/s"),
                         "hbm_bandwidth.value", "got the text '3.35e12'"),
    "negative": (_mutated(lambda d: d["hbm_capacity_usable"].update(value=-80)),
                 "hbm_capacity_usable.value", "out of range; allowed 7.45058 to 1862.65 GiB"),
    "wrong_unit": (_mutated(lambda d: d["hbm_capacity_usable"].update(unit="TB/s")),
                   "hbm_capacity_usable.unit", "allowed: B, GB, TB, GiB, TiB"),
    "unknown_rate": (_mutated(lambda d: d["peak_flops"].update(fp16=d["peak_flops"]["bf16"])),
                     "peak_flops.fp16", "allowed: fp32, bf16, fp8, fp4, int8"),
    "sparse_fp8": (_mutated(lambda d: d["peak_flops"]["fp8"].update(value=900)),
                   "peak_flops.fp8", "below the bf16 rate"),
    "uncited_source": (_mutated(lambda d: d["hbm_bandwidth"].update(source="S99")),
                       "hbm_bandwidth.source", "'S99' is not in the sources table"),
    "bool_as_number": (_mutated(lambda d: d["hbm_bandwidth"].update(value=True)),
                       "hbm_bandwidth.value", "expected a number, got True"),
    "bad_date": (_mutated(lambda d: d["hbm_bandwidth"].update(date="July 2026")),
                 "hbm_bandwidth.date", "write YYYY, YYYY-MM or YYYY-MM-DD"),
    "bad_fp4_format": (_mutated(lambda d: d.update(fp4_formats=["fp4x"])), "fp4_formats.0",
                       "allowed: nvfp4, mxfp4"),
    "bad_reference": (_mutated(lambda d: d["calibration_reference"].update(value="a100")),
                      "calibration_reference.value", "allowed: h100_sxm, h200_sxm, b200_sxm"),
    "source_without_url_or_method": (
        _mutated(lambda d: d.update(sources={"X-mine": {"title": "a reading", "accessed": "2026-12",
                                                         "kind": "weak"}})),
        "sources.X-mine", "needs a url, or a method"),
    "redefined_shared_source": (
        _mutated(lambda d: d.update(sources={"S03": {"title": "t", "url": "https://example.org",
                                                      "accessed": "2026-12", "kind": "weak"}})),
        "sources.S03", "already defined in"),
}


def test_a_file_may_add_its_own_sources(tmp_path):
    # a spec outside the repository cites a source of its own next to the shared ones
    data = yaml.safe_load(BASE)
    data["hbm_bandwidth"]["source"] = ["S03", "X-lab"]
    data["sources"] = {"X-lab": {"title": "our STREAM run", "method": "STREAM triad on 8 GPUs",
                                 "accessed": "2026-12", "kind": "third_party"}}
    path = tmp_path / "h100-lab.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    hw = load_hardware(path)
    assert hw.provenance["hbm_bandwidth_bytes_per_s"].sources == ("S03", "X-lab")
    assert hw.sources["X-lab"].method == "STREAM triad on 8 GPUs"
    assert set(hw.sources) >= {"S03", "X-lab"}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_file_names_file_and_key(case, tmp_path):
    text, key, problem = MALFORMED[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_hardware(path)
    message = str(err.value)
    assert str(path) in message and f": {key}:" in message and problem in message
    assert "\n" not in message


def test_cli_list_and_show(capsys):
    # In-process through the entry point (`servecast` = model.frontends.cli:main); the subprocess path is
    # exercised by the malformed-file test below.
    from model.frontends.cli import main

    assert main(["hardware", "list", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["hardware"]) >= 12

    assert main(["hardware", "show", "gb300", "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["name"] == "gb300-nvl72" and spec["tco_usd_per_gpu_hour"] == 2.31
    assert spec["hbm_bandwidth_bytes_per_s"] == 8e12 and "S05" in spec["sources"]
    assert spec["provenance"]["hbm_bandwidth_bytes_per_s"]["sources"] == ["S05"]
    assert math.isclose(spec["ridge_flop_per_byte"], 2.5e15 / 8e12)

    assert main(["hardware", "show", "nosuch", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "allowed: b200" in captured.err


def test_cli_malformed_file_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(MALFORMED["number_as_string"][0])
    failed = servecast("hardware", "show", str(bad))
    assert failed.returncode == 2 and failed.stdout == ""
    assert failed.stderr.count("\n") == 1 and "Traceback" not in failed.stderr
    assert str(bad) in failed.stderr and "hbm_bandwidth.value" in failed.stderr
