"""Run in a process of its own by tests/test_memory_levers.py (torch: under torchrun, one per
rank; jax: one process over 2 host devices): build the tiny model with the given parallel /
memory options, take three training steps, print one JSON line per process with the parameter
elements the first local device holds, the global count, the losses, and the backend's own
count of state bytes on its fullest device (the state_mib_per_device metric). An optional last
argument, JSON, overrides the model's dims (model=custom: its builder, from examples/)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))  # model=custom's builders

from conftest import backend_class, job_spec  # noqa: E402
from fxtrack.worker.__main__ import prepare_environment  # noqa: E402


def local_elements(framework: str, backend) -> int:
    if framework == "torch":
        from fxtrack.frameworks.torch import parallel

        return parallel.local_param_count(backend.model)
    import jax

    return sum(x.addressable_shards[0].data.size for x in jax.tree.leaves(backend.state.params))


def fsdp_units(framework: str, backend) -> int | None:
    """torch: the modules FSDP2 sharded as units (each block, then the root); jax has none."""
    if framework != "torch":
        return None
    from torch.distributed.fsdp import FSDPModule

    return sum(isinstance(m, FSDPModule) for m in backend.model.modules())


def main(framework: str, model: str, mode: str, memory: str, devices: str, arch: str = "{}"
         ) -> None:
    # Llama eager: its checks are about sharding and recompute, and inductor's CPU build of the
    # decoder's fsdp and checkpointed graphs took ~100 s per run on a contended 2-core machine.
    # A user's model eager too: its compile=auto rule on CPU is eager.
    spec = job_spec(framework, model, devices=int(devices), parallel=mode, memory=memory,
                    launcher="torchrun" if framework == "torch" else "process",
                    compile=not model.startswith(("llama", "custom")), arch=json.loads(arch))
    prepare_environment(spec)  # JAX: --xla_force_host_platform_device_count before import
    backend = backend_class(spec)(spec)
    backend.device_kind()
    backend.build(2)
    losses = [backend.loss_value(backend.train_step()) for _ in range(3)]
    line = json.dumps({"rank": int(os.environ.get("RANK", "0")),
                       "local": local_elements(framework, backend),
                       "fsdp_units": fsdp_units(framework, backend),
                       "total": backend.param_count(), "losses": losses,
                       "state_bytes": backend.state_bytes_per_device()}) + "\n"
    # One write of under PIPE_BUF bytes: the ranks share the pipe, and print() may split a line
    # into two writes, between which the other rank's line lands.
    os.write(sys.stdout.fileno(), line.encode())
    if framework == "torch":
        from fxtrack.frameworks.torch import parallel

        parallel.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
