"""Engine and benchmark-client defaults, in one place: every module that needs one imports it
from here, so a default changes in one line.

Engine: vLLM V1's online-serving defaults on datacenter GPUs (vllm/config/scheduler.py and
vllm/engine/arg_utils.py, https://github.com/vllm-project/vllm). Client: InferenceX's AgentX
replay (https://github.com/SemiAnalysisAI/InferenceX, AIPerf trace replay options)."""

MAX_NUM_BATCHED_TOKENS = 8192  # token budget per engine step (per DP rank)
MAX_NUM_SEQS = 256  # running requests per engine step (per DP rank)
GPU_MEMORY_UTILIZATION = 0.9  # share of HBM the engine may take (--gpu-memory-utilization)
TURN_GAP_CAP_S = 300.0  # a session's tool/think gap before a turn is cut to this (per trajectory)
SYSTEM_IDLE_CAP_S = 10.0  # the replay skips all-idle time beyond this (--system-idle-gap-cap-seconds)

# How the engine launches a step's kernels: `cuda-graphs` replays one captured graph per step
# (vLLM's default); `eager` (--enforce-eager) launches every kernel from the host, the host
# running ahead of the GPU; `eager-blocking` adds CUDA_LAUNCH_BLOCKING=1, so each launch returns
# only when its kernel has finished and the GPU idles while the host issues the next one.
KERNEL_LAUNCH_MODES = ("cuda-graphs", "eager", "eager-blocking")
KERNEL_LAUNCH = "cuda-graphs"
# Host time to issue one kernel from PyTorch eager code (Python, dispatcher, cudaLaunchKernel):
# "usually between 5-20 microseconds" (Holistic Trace Analysis, CUDA kernel launch stats,
# https://github.com/facebookresearch/HolisticTraceAnalysis docs/source/features/
# cuda_kernel_launch_stats.rst); the range's lower middle is taken, an assumption.
EAGER_LAUNCH_S = 10e-6
# The attention kernels the engine runs (vLLM --attention-backend). `default`: the backend vLLM
# picks for the model on the chip (FlashAttention, FlashInfer, the model's own kernels), which
# splits a long context across programs. `triton`: vLLM's Triton unified attention, whose 2D path,
# taken for every speculative-decoding verify step (query length > 1) and above
# TRITON_3D_MAX_GRID // KV heads sequences, walks each sequence's whole context in one program
# (vllm/v1/attention/ops/triton_unified_attention.py; vLLM pull 53930: "-61% at 50K context on an
# A100" with speculative decoding).
ATTENTION_BACKENDS = ("default", "triton")
ATTENTION_BACKEND = "default"
# The drafter's attention kernels (vLLM speculative_config.attention_backend): `same` as the
# target's, vLLM's default when the config names none. The drafter's first pass takes each
# sequence's verified tokens, more than one query, so on `triton` it walks its context too.
DRAFT_ATTENTION_BACKENDS = ("same", *ATTENTION_BACKENDS)
DRAFT_ATTENTION_BACKEND = "same"
TRITON_3D_MAX_GRID = 128  # vLLM triton_attn MIN_LAUNCH_GRID_SIZE_2D
TRITON_2D_TILE_TOKENS = 32  # the 2D path's KV tile (TILE_SIZE_PREFILL)
# One program's time per KV tile of that walk: 835.5 us over 16,384 tokens (512 tiles) on an
# A100-SXM4-80GB, 28 query / 4 KV heads, head dim 128, bf16, query length 16, torch profiler
# (github.com/cadamcat/dual-radeon-vllm benchmarks/cuda-a100/52684-kv-depth/kv_depth3.jsonl,
# 2026-08-31). The loop is latency-bound (ncu: DRAM under 1%, vLLM pull 43257), so more bandwidth
# does not shorten it; taken unchanged to every GPU (an assumption: a faster clock would).
TRITON_2D_TILE_S = 835.5e-6 / 512
# What a blocking launch adds: the host waits for the kernel's completion before it returns.
# NVIDIA's "Getting Started with CUDA Graphs" (developer.nvidia.com/blog/cuda-graphs, V100) times
# a 2.9 us kernel at 9.6 us per kernel with a stream synchronization after each launch and
# 3.8 us without, 5.8 us per synchronous round trip; taken to carry to Hopper hosts (assumed).
SYNC_ROUND_TRIP_S = 5.8e-6
# Host time the serving front end spends on a request before the engine sees it, per prompt
# token: the chat API is stateless, so every agentic turn resends its whole context and the
# front end renders and tokenizes all of it again. HF tokenizers take 43.7 ms for a ~38K-token
# prompt in TensorRT-LLM's front end, nsys-timed (github.com/NVIDIA/TensorRT-LLM/pull/18389):
# 1.15 us per token. A prefix-tokenization cache cut MiniMax M3's AgentX TTFT P50 on B300 by
# 160-190 ms (github.com/NVIDIA/TensorRT-LLM/pull/19373), the same order at AgentX contexts.
# Template rendering and request parsing come on top and are not counted (an assumption: this
# is a floor), nor is queueing between requests in the front end.
FRONTEND_S_PER_PROMPT_TOKEN = 1.15e-6
# The request front ends the engines run behind: vLLM's Python OpenAI server, its Rust front end
# (VLLM_USE_RUST_FRONTEND=1), NVIDIA Dynamo's. A Python front end also renders the chat template
# over the whole conversation with Jinja2 on every request: "pure-CPU jinja + python work that
# grows with conversation length: hundreds of ms per request at ~100k-token chats"
# (github.com/NVIDIA/TensorRT-LLM/pull/16231, TensorRT-LLM's Python front end, Qwen3.5 agentic
# traces); the low end of that, 200 ms per 100K tokens, is taken (an assumption). The Rust front
# ends render in Rust (minijinja): not counted. Queueing in the front end is not modeled.
FRONTENDS = ("python", "rust", "dynamo")
FRONTEND_RENDER_S_PER_PROMPT_TOKEN = {"python": 2.0e-6, "rust": 0.0, "dynamo": 0.0}

# The planner's built-in scenario (`make run`, `servecast plan` without flags): the vLLM AgentX
# post's DeepSeek V4 Pro row (1P DEP4 + 1D DEP8 on 12 GB300, P90 interactivity over 50 tok/s),
# and the API model its cost comparison prices against
DEFAULT_SCENARIO = {"arch": "deepseek-v4-pro", "hardware": "gb300-nvl72", "gpus": 12,
                    "workload": "agentx", "slo_p90_interactivity": 50.0}
DEFAULT_API_MODEL = "claude-opus-5"
MODES = ("aggregated", "disaggregated")  # deployment modes: one replica type, or P/D workers
