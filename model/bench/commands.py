"""`bench_commands()`: whole-process wall time of the commands users wait for, each the median of
a few fresh processes, printed beside its target (targets as the speed issue states them, on a
2-core machine; nothing asserts them).

A fresh process pays the interpreter, the imports and the spec loading every time, which is
what a user at a shell or a papermill batch pays; in-process timings (the other benches) leave
those out.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from model import ROOT

# (label, arguments after `servecast`, target seconds)
QUICK = (
    ("--help", ["--help"], 0.3),
    ("hardware list", ["hardware", "list"], 0.3),
    ("estimate", ["estimate", "--arch", "deepseek-ai/DeepSeek-V3", "--hardware", "h200",
                  "--isl", "1024", "--osl", "1024", "--concurrency", "16", "--tp", "8"], 0.3),
    ("serve TP2 MiniMax M3, 24 sessions", ["serve", "--arch", "minimax-m3", "--hardware", "b300",
                                           "--tp", "2", "--workload", "agentx-v1",
                                           "--concurrency", "24"], 0.5),
    ("serve DEP8 DeepSeek V4, 64 sessions, threshold 512",
     ["serve", "--arch", "deepseek-v4-pro", "--hardware", "b300", "--dp", "8", "--ep", "8",
      "--workload", "agentx-v1", "--concurrency", "64", "--long-prefill-token-threshold", "512"],
     0.5),
    ("serve DEP8 DeepSeek V4, 256 sessions", ["serve", "--arch", "deepseek-v4-pro", "--hardware",
                                              "b300", "--dp", "8", "--ep", "8", "--workload",
                                              "agentx-v1", "--concurrency", "256"], 0.5),
    ("plan DeepSeek V4 Pro, 12 GB300", ["plan", "--arch", "deepseek-v4-pro", "--hardware",
                                        "gb300", "--gpus", "12", "--workload", "agentx-v1"], 1.5),
    ("plan Kimi K3, 16 GB300", ["plan", "--arch", "kimi-k3", "--hardware", "gb300", "--gpus",
                                "16", "--workload", "agentx-v1"], 1.5),
    ("plan MiniMax M3, 2 B300", ["plan", "--arch", "minimax-m3", "--hardware", "b300", "--gpus",
                                 "2", "--workload", "agentx-v1", "--precision", "fp8"], 1.5),
)
LONG = (
    ("reproduce vllm-agentx --json", ["reproduce", "vllm-agentx", "--json"], 60.0),
)
# the same questions asked again: answered from the answer cache (model.frontends.answers)
WARM = tuple((f"{label}, warm", args, 0.5) for label, args, _ in QUICK
             if args[0] == "plan")
ANSWERS_OFF = {"SERVECAST_ANSWER_CACHE": "off"}  # every QUICK and LONG figure is computed


def wall_s(args: list[str], answers: bool = False) -> float:
    """Wall seconds of one `servecast ARGS` process (its output discarded); a failed command
    raises, so a bench never reports the time of an error. The process may write and reuse
    bytecode, as an installed command does, even where the environment says not to
    (PYTHONDONTWRITEBYTECODE): compiling the model's modules from source costs each command
    about 0.2 s. Without `answers`, the command computes its answer (the answer cache off)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update({} if answers else ANSWERS_OFF)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "model.frontends.cli", *args], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def bench_commands(repeats: int = 3, long: bool = False) -> dict:
    """{label: "median s (target s)"} over `repeats` processes per command, computed; the plans
    also warm (asked again, answered from the answer cache); with `long`, the reproduction too
    (minutes, once)."""
    out = {}
    for label, args, target in QUICK:
        median = statistics.median(wall_s(args) for _ in range(repeats))
        out[label] = f"{median:.2f} s (target <= {target:g} s)"
    for label, args, target in WARM:
        wall_s(args, answers=True)  # asked once: the answer is stored
        median = statistics.median(wall_s(args, answers=True) for _ in range(repeats))
        out[label] = f"{median:.2f} s (target <= {target:g} s)"
    for label, args, target in LONG if long else ():
        out[label] = f"{wall_s(args):.1f} s (target <= {target:g} s)"
    return out
