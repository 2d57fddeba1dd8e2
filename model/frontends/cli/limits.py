"""Checks the commands share on what a request may ask: the closed-loop sessions the serving model
answers for, the NVMe tier only where the chip has local NVMe, a workload file that is readable
text. Each refusal is one line naming the flag or file and what it allows."""

from __future__ import annotations

from pathlib import Path

from model.specs.errors import ServecastError

# serve and plan answer for at most this many closed-loop sessions per GPU: the load at which the
# closed form is checked against the discrete-event simulator (model.validate.agreement,
# dsv4-dep8-pop64-n1024: 1,024 AgentX sessions on 8 GPUs); the closed form is not checked past it
SESSIONS_PER_GPU_CAP = 128


def within_session_cap(concurrency: int, gpus: int, flag: str = "--concurrency") -> None:
    """Refuse more closed-loop sessions than SESSIONS_PER_GPU_CAP per GPU of the deployment."""
    cap = SESSIONS_PER_GPU_CAP * gpus
    if concurrency > cap:
        raise ServecastError(f"{flag}: {concurrency:,} sessions on {gpus:,} GPUs; allowed: "
                             f"1..{cap:,} ({SESSIONS_PER_GPU_CAP} per GPU, the load the closed "
                             f"form is checked against the simulator at)")


def require_nvme(hw, tiers, flag: str) -> None:
    """An nvme tier among `tiers` needs local NVMe on `hw` (capacity 0 in the spec: none)."""
    if "nvme" in tiers and hw.nvme_bytes_per_gpu <= 0:
        allowed = "host, remote" if flag == "--tier" else "hbm, host"
        raise ServecastError(f"{flag}: nvme: {hw.name} has no local NVMe "
                             f"(nvme_capacity_per_gpu 0 in its spec); allowed: {allowed}")


def readable_workload(name: str) -> str:
    """`name` unchanged; where it is a path to a .yaml profile, the file must be a readable
    YAML mapping (a folder or a binary file is one line naming it)."""
    from model.specs.specio import read_yaml_mapping  # loads pydantic and yaml

    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.exists():
        read_yaml_mapping(path)
    return name
