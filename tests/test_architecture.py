"""Architecture loader: name resolution, per-layer normalization, precision, coverage of every
config file under data/architectures/, and one-line errors for malformed input."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from model.frontends.cli.arch import describe
from model.frontends.cli.output import to_json
from model.specs.architecture import (
    DATA,
    UNSUPPORTED,
    list_architectures,
    load_architecture,
    resolve,
)
from model.specs.dtypes import dtype
from model.specs.errors import ServecastError, SpecError

# Files the loader cannot express yet, each with its reason (also in architecture.UNSUPPORTED).
UNSUPPORTED_FILES = {
    "llama-3_3-nemotron-super-49b-v1": "nemotron-nas",  # no-op attention blocks
}


def kinds(arch) -> Counter:
    return Counter(layer.attention.kind for layer in arch.main_layers)


# Files under data/architectures/ that are not architectures, and why.
NOT_ARCHITECTURES = {
    "README.md": "provenance notes",
    "PROVENANCE.md": "where each short-name config comes from",
    "aliases.yaml": "name table read by model.specs.architecture",
    # DeepSeek's reference-inference schema (dim, n_layers, ...), kept for provenance; the same
    # values load as deepseek-v3.2 (alias deepseek-ai/DeepSeek-V3.2-Exp)
    "inference-configs/deepseek-v3.2-exp_config_671B_v3.2.json": "not an HF config.json",
}


def test_every_file_loads_or_is_listed():
    files = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file())
    sidecars = [f for f in files if f.endswith("_hf_quant_config.json")]
    configs = [f for f in files if f not in sidecars and f not in NOT_ARCHITECTURES]
    assert set(NOT_ARCHITECTURES) <= set(files)
    failed, loaded_paths = {}, set()
    for name in list_architectures():
        path = resolve(name).path
        loaded_paths.add(str(path.relative_to(DATA)))
        try:
            arch = load_architecture(name)
        except SpecError as err:
            failed[name] = str(err)
            continue
        assert arch.main_layers, name
        # the `arch show` object serializes (what `servecast arch show NAME --json` prints)
        shown = json.loads(to_json(describe(name)))
        assert shown["total_params"] > 0 and shown["num_layers"] == len(arch.main_layers)
    # every config file is reachable by a name; slug files with an hf/ twin resolve to the twin
    twins = {f for f in configs if "/" not in f and f not in loaded_paths}
    assert all(resolve(f.removesuffix(".json")).path.parent.name == "hf" for f in twins)
    assert set(configs) == loaded_paths | twins
    # each ModelOpt sidecar belongs to a config that loads with its precision
    for sidecar in sidecars:
        config = sidecar.replace("_hf_quant_config.json", "_config.json")
        assert config in configs
    assert set(failed) == set(UNSUPPORTED_FILES)
    for name, model_type in UNSUPPORTED_FILES.items():
        assert model_type in UNSUPPORTED and "unsupported" in failed[name]


@pytest.mark.parametrize("name,hf_id", [
    ("deepseek-v4-pro", "deepseek-ai/DeepSeek-V4-Pro"),
    ("deepseek-ai/DeepSeek-V4-Pro", "deepseek-ai/DeepSeek-V4-Pro"),
    ("zhipuai/GLM-5", "zai-org/GLM-5"),  # alias used by measured data
    ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-R1"),
    ("meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B"),
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B"),
    ("Qwen/Qwen3-235B-A22B-FP8", "Qwen/Qwen3-235B-A22B-FP8"),
    ("nvidia/DeepSeek-R1-NVFP4", "nvidia/DeepSeek-V3.1-NVFP4"),
    ("minimax-m2", "MiniMaxAI/MiniMax-M2"),  # slug file without an hf/ copy
])
def test_names_resolve(name, hf_id):
    assert resolve(name).hf_id == hf_id


def test_slug_prefers_hf_copy():
    # README: "Prefer the hf/ copy where both exist"
    assert resolve("kimi-k3").path.parent.name == "hf"
    assert load_architecture("kimi-k3").name == "kimi-k3"


def test_every_calibration_model_path_resolves():
    # model_path values of data/calibration/e2e_measured.csv
    for model_path in ["deepseek-ai/DeepSeek-R1", "openai/gpt-oss-120b", "meta-llama/Llama-3.1-70B",
                       "Qwen/Qwen3-32B", "deepseek-ai/DeepSeek-V3",
                       "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-235B-A22B-FP8",
                       "nvidia/Llama-3.1-8B-Instruct-FP8", "nvidia/DeepSeek-R1-NVFP4",
                       "nvidia/Qwen3-32B-NVFP4", "nvidia/DeepSeek-V3.1-NVFP4"]:
        load_architecture(model_path)
    # aliases that imply a precision carry it (nvidia/*-FP8 = per-tensor FP8 weights)
    assert load_architecture("nvidia/Llama-3.1-8B-Instruct-FP8").weight_dtype == "fp8"
    assert load_architecture("nvidia/Qwen3-32B-NVFP4").weight_dtype == "nvfp4"


def test_unknown_model_lists_close_matches():
    with pytest.raises(ServecastError, match="close matches: .*deepseek-v4-pro"):
        resolve("deepseek-v4-pr")


def test_config_path_loads(tmp_path):
    src = json.loads((DATA / "llama-3.1-70b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(src))
    assert len(load_architecture(str(path)).layers) == 80


def test_missing_keys_are_named(tmp_path):
    src = json.loads((DATA / "deepseek-v3.json").read_text())
    del src["kv_lora_rank"], src["qk_rope_head_dim"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(src))
    with pytest.raises(SpecError, match="kv_lora_rank, qk_rope_head_dim: missing for family"):
        load_architecture(str(path))


def test_unknown_family_lists_supported(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba_transformer_9000", "hidden_size": 8}))
    with pytest.raises(SpecError, match="'mamba_transformer_9000' has no loader; supported: .*llama"):
        load_architecture(str(path))


def test_bad_json_is_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{ not json")
    with pytest.raises(SpecError) as err:
        load_architecture(str(path))
    assert "\n" not in str(err.value) and "not valid JSON" in str(err.value)


def test_deepseek_v3_layers():
    # config: 61 layers, first_k_dense_replace 3, 256 experts top-8, 1 shared, MTP 1
    arch = load_architecture("deepseek-v3")
    assert kinds(arch) == {"mla": 61}
    assert [layer.mlp.kind for layer in arch.main_layers[:4]] == ["dense"] * 3 + ["moe"]
    layer = arch.layers[10]
    assert layer.attention.kv_lora_rank == 512 and layer.attention.qk_rope_head_dim == 64
    assert layer.mlp.experts.num_experts == 256 and layer.mlp.experts.top_k == 8
    assert len(arch.mtp_layers) == 1 and arch.mtp_layers[0].mtp
    # fp8 block-128 checkpoint: every projection fp8_block, LM head and router bf16
    assert layer.mlp.experts.dtype == "fp8_block" and arch.weight_dtype == "fp8_block"
    assert arch.lm_head.dtype == "bf16"
    assert next(p for p in layer.mlp.projections if p.name == "mlp.gate").dtype == "bf16"


def test_deepseek_v32_has_indexer_every_layer():
    # V3.2 config: index_n_heads 64, index_head_dim 128, index_topk 2048 on all 61 layers
    arch = load_architecture("deepseek-v3.2")
    assert kinds(arch) == {"dsa": 61}
    idx = arch.layers[0].attention.indexer
    assert (idx.num_heads, idx.head_dim, idx.top_k, idx.cache_dtype) == (64, 128, 2048, "fp8")


def test_deepseek_v4_pro_layers():
    # deepseek-ai--DeepSeek-V4-Pro_config.json: compress_ratios [128,128, then 4,128 alternating]
    # -> 30 CSA + 31 HCA, window 128, hash routing on the first 3 MoE layers, mHC width 4,
    # grouped output projection 16 groups x rank 1024, MTP layer SWA-only, FP4 experts
    arch = load_architecture("deepseek-v4-pro")
    assert kinds(arch) == {"csa": 30, "hca": 31}
    assert arch.layers[0].attention.kind == "hca" and arch.layers[2].attention.kind == "csa"
    assert arch.mtp_layers[0].attention.kind == "swa"
    assert {layer.attention.window for layer in arch.layers} == {128}
    csa = arch.layers[2].attention
    assert csa.compress_ratio == 4 and csa.indexer.top_k == 1024 and csa.indexer.cache_dtype == "mxfp4"
    assert arch.layers[1].attention.compress_ratio == 128 and arch.layers[1].attention.indexer is None
    assert [layer.mlp.experts.hash_routed for layer in arch.layers[:4]] == [True] * 3 + [False]
    assert arch.hyper_connections == 4
    wo_a = next(p for p in csa.projections if p.name == "attn.wo_a")
    assert (wo_a.in_features, wo_a.out_features, wo_a.count) == (128 * 512 // 16, 1024, 16)
    assert arch.layers[5].mlp.experts.dtype == "mxfp4" and arch.weight_dtype == "fp8_block"
    assert arch.default_kv_dtype == "fp8"


def test_deepseek_v4_flash_first_layers_sliding_only():
    # Flash compress_ratios start [0, 0, 4, 128, ...]: 2 SWA-only + 21 CSA + 20 HCA
    arch = load_architecture("deepseek-v4-flash")
    assert kinds(arch) == {"swa": 2, "csa": 21, "hca": 20}
    assert arch.layers[2].attention.indexer.top_k == 512


def test_nvfp4_export_keeps_attention_fp8():
    # nvidia/DeepSeek-V4-Pro-NVFP4: MIXED_PRECISION, experts NVFP4, `*.attn.*` ignored (kept at
    # the original fp8 block format of quant_method fp8)
    arch = load_architecture("nvidia/DeepSeek-V4-Pro-NVFP4")
    layer = arch.layers[5]
    assert layer.mlp.experts.dtype == "nvfp4"
    assert {p.dtype for p in layer.attention.projections if p.name == "attn.wq_a"} == {"fp8_block"}


def test_kimi_k3_layers():
    # K3 config text_config: 69 KDA + 24 MLA (1-based ids 4, 8, ..., 92, 93), layer 0 dense,
    # 896 experts top-16, 2 shared, latent width 3584; MXFP4 experts, everything else bf16.
    # The experts are weight-only (compressed-tensors group input_activations: null; vLLM PR
    # #50000: "K3 is weight-only MXFP4 (W4A16)"), so they compute at the BF16 rate
    arch = load_architecture("kimi-k3")
    assert kinds(arch) == {"linear": 69, "mla": 24}
    assert arch.layers[3].attention.kind == "mla" and arch.layers[92].attention.kind == "mla"
    kda = arch.layers[0].attention
    assert kda.state_elements == 96 * 128 * 128
    experts = arch.layers[1].mlp.experts
    assert (experts.num_experts, experts.top_k, experts.hidden_size) == (896, 16, 3584)
    assert experts.dtype == "mxfp4_w4a16" and arch.weight_dtype == "bf16"
    assert dtype(experts.dtype).rate == "bf16" and dtype(experts.dtype).bits == 4.25
    assert arch.layers[0].mlp.kind == "dense" and arch.mtp_layers == ()


def test_minimax_m3_layers():
    # M3: layers 0-2 dense GQA (64 q / 4 kv x 128), 57 MSA layers (4 index heads x 128, top-16
    # blocks of 128), first 3 MLPs dense (12288), MoE 128 experts top-4 + shared 3072
    arch = load_architecture("minimax-m3")
    assert kinds(arch) == {"gqa": 3, "msa": 57}
    msa = arch.layers[3].attention
    assert (msa.num_heads, msa.num_kv_heads, msa.head_dim) == (64, 4, 128)
    assert (msa.indexer.num_heads, msa.indexer.top_k, msa.indexer.block_size) == (4, 16, 128)
    assert [layer.mlp.kind for layer in arch.layers[2:4]] == ["dense", "moe"]


def test_gpt_oss_windows_and_precision():
    # gpt-oss-120b: layer_types alternate sliding (128) / full; MXFP4 experts, attention and
    # router bf16 (modules_to_not_convert)
    arch = load_architecture("gpt-oss-120b")
    assert kinds(arch) == {"swa": 18, "gqa": 18}
    assert arch.layers[0].attention.window == 128 and arch.layers[1].attention.window is None
    assert arch.layers[0].mlp.experts.dtype == "mxfp4"
    assert {p.dtype for p in arch.layers[0].attention.projections} == {"bf16"}


def test_hybrid_linear_families():
    # Qwen3-Next: full_attention_interval 4 -> 12 gated-attention + 36 Gated DeltaNet layers,
    # GDN state 32 value heads x 128 x 128 (linear_num_value_heads, linear_*_head_dim)
    qn = load_architecture("qwen3-next-80b-a3b")
    assert kinds(qn) == {"gqa": 12, "linear": 36}
    assert qn.layers[0].attention.state_elements == 32 * 128 * 128
    # MiniMax M1: attn_type_list 1 every 8th layer -> 10 softmax + 70 lightning
    assert kinds(load_architecture("minimax-m1")) == {"gqa": 10, "linear": 70}
    # Nemotron-H 56B pattern: 54 Mamba-2 mixers + 10 attention mixers
    nh = load_architecture("nvidia/Nemotron-H-56B-Base-8K")
    assert kinds(nh) == {"linear": 54, "gqa": 10}


def test_vl_wrapper_and_tied_embeddings():
    # Qwen3-VL configs keep the language model under text_config; Qwen3-0.6B ties embeddings
    vl = load_architecture("Qwen/Qwen3-VL-32B-Instruct")
    assert len(vl.layers) == 64 and vl.hidden_size == 5120
    small = load_architecture("Qwen/Qwen3-0.6B")
    assert small.tie_word_embeddings and small.lm_head is small.embedding


def test_weight_dtype_override():
    arch = load_architecture("llama-3.1-70b", weight_dtype="nvfp4")
    assert {p.dtype for layer in arch.layers for p in layer.attention.projections} == {"nvfp4"}
    assert arch.embedding.dtype == "bf16" and arch.lm_head.dtype == "bf16"
    with pytest.raises(ServecastError, match="unknown dtype"):
        load_architecture("llama-3.1-70b", weight_dtype="fp5")


def test_load_is_cached():
    assert load_architecture("deepseek-v3") is load_architecture("deepseek-ai/DeepSeek-V3")


def test_inference_config_folder_is_not_an_architecture():
    # DeepSeek's reference-inference schema (dim, n_layers) is kept for provenance only
    assert all("inference-configs" not in str(resolve(n).path) for n in list_architectures())
    assert Path(DATA / "inference-configs").is_dir()


@pytest.mark.parametrize("key,value", [("hidden_size", "7168"), ("num_hidden_layers", -1),
                                       ("n_routed_experts", 25.6), ("kv_lora_rank", True)])
def test_malformed_numbers_are_rejected(tmp_path, key, value):
    src = json.loads((DATA / "deepseek-v3.json").read_text())
    src[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(src))
    with pytest.raises(SpecError, match=f"{key}: must be a non-negative integer"):
        load_architecture(str(path))


def test_malformed_structure_is_one_line(tmp_path):
    # compress_ratios shorter than expected is padded; a string in it is malformed
    src = json.loads((DATA / "deepseek-v4-flash.json").read_text())
    src["compress_ratios"] = ["four"] * 44
    path = tmp_path / "config.json"
    path.write_text(json.dumps(src))
    with pytest.raises(SpecError, match="compress_ratios") as err:
        load_architecture(str(path))
    assert "\n" not in str(err.value)


def test_compressed_tensors_mxfp4_weight_only_vs_w4a4():
    # compressed-tensors 4-bit float group 32: with quantized input activations the group is
    # W4A4 MXFP4 (FP4 tensor cores); without (input_activations null, Kimi K3's config) it is
    # weight-only and meets BF16 activations (vLLM select_mxfp4_moe_backend: SM100_FI_MXFP4_BF16
    # first on Blackwell)
    from model.specs.families.quant import parse_quant
    weights = {"num_bits": 4, "type": "float", "group_size": 32}
    act = {"num_bits": 4, "type": "float", "group_size": 32, "dynamic": True}
    for inputs, expected in ((None, "mxfp4_w4a16"), (act, "mxfp4")):
        q = {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
             "config_groups": {"group_0": {"weights": weights, "input_activations": inputs,
                                           "targets": ["Linear"]}}, "ignore": []}
        assert parse_quant({"quantization_config": q}, None, "config.json").quantized == expected
