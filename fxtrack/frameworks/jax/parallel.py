"""Data parallelism for JAX: one jitted step over a 1-D device mesh (``jax.sharding``).

The batch is sharded along the mesh's ``"data"`` axis, parameters and optimiser state are
replicated, and the step is the single-device one jitted with those shardings: XLA's SPMD
partitioner inserts the gradient all-reduce itself (no hand-written ``pmean``). Across nodes,
``jax.distributed`` joins the processes into one runtime whose ``jax.devices()`` spans them
all, so the same mesh code covers one device, one host's devices and many hosts'.

Sharding a single program would reduce BatchNorm's batch statistics over the *global* batch
(synchronised BatchNorm), where PyTorch's DDP and Keras normalise per device; the models'
``DeviceBatchNorm`` normalises each device's shard on its own instead, as the others do.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fxtrack.worker.protocol import JobSpec

AXIS = "data"  # the mesh axis the batch dimension is split over


def init(spec: JobSpec) -> None:
    """Prepare the runtime before anything touches a device: join the other nodes
    (``jax.distributed``), and give the CPU backend ``spec.devices`` devices to shard over."""
    if spec.devices > 1:
        # The worker sets XLA_FLAGS for hardware=cpu; this covers hardware=auto on a CPU-only
        # host too. It sizes only the CPU backend, so a GPU run is unaffected.
        try:
            jax.config.update("jax_num_cpu_devices", spec.devices)
        except RuntimeError:  # backends already up (JAX used earlier in this process):
            pass  # make_mesh says so if there are too few devices
    if spec.nodes > 1 and not jax.distributed.is_initialized():
        # The worker writes the Result only where RANK is "0" or unset: node 0 then reports for
        # every node (its throughput already counts the global batch), the others write nothing.
        os.environ["RANK"] = str(spec.node_rank)
        jax.distributed.initialize(coordinator_address=spec.coordinator,
                                   num_processes=spec.nodes, process_id=spec.node_rank)


def make_mesh(first: jax.Device, per_process: int) -> Mesh:
    """A 1-D mesh over the first ``per_process`` devices of ``first``'s platform on every
    process (every node), ordered by process then device id."""
    everywhere = jax.devices(first.platform)  # all processes' devices
    chosen = []
    for p in range(jax.process_count()):
        mine = [d for d in everywhere if d.process_index == p][:per_process]
        if len(mine) < per_process:
            raise RuntimeError(
                f"devices={per_process}, but JAX sees {len(mine)} {first.platform} device(s) on "
                f"process {p}; on a CPU use hardware=cpu (the worker then sets "
                f"--xla_force_host_platform_device_count)")
        chosen += mine
    return Mesh(np.array(chosen), (AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array (parameters, optimiser state, the loss)."""
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Dimension 0 (the batch) split evenly over the ``"data"`` axis."""
    return NamedSharding(mesh, P(AXIS))


def local_devices(mesh: Mesh) -> list[tuple[int, jax.Device]]:
    """(position in the mesh, device) for the mesh devices this process drives."""
    me = jax.process_index()
    return [(i, d) for i, d in enumerate(mesh.devices.flat) if d.process_index == me]


def replicate(tree: Any, mesh: Mesh) -> Any:
    """``tree`` (the same values on every process) copied onto every mesh device."""
    sharding = replicated(mesh)
    if sharding.is_fully_addressable:  # one process: a device-to-device copy
        return jax.device_put(tree, sharding)

    def put(x: Any) -> jax.Array:  # many processes: each fills its own devices from its copy
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(put, tree)


def shard_batch(make: Callable[[int], dict[str, np.ndarray]], mesh: Mesh) -> dict[str, jax.Array]:
    """The global batch whose shard on mesh device ``i`` is ``make(i)`` (a host batch of the
    per-device size): each device trains on its own data, made where it lives."""
    local = [(d, make(i)) for i, d in local_devices(mesh)]
    sharding, n = batch_sharding(mesh), mesh.devices.size
    out = {}
    for key, first in local[0][1].items():
        shape = (first.shape[0] * n, *first.shape[1:])  # (per-device batch x devices, ...)
        pieces = [jax.device_put(batch[key], d) for d, batch in local]
        out[key] = jax.make_array_from_single_device_arrays(shape, sharding, pieces)
    return jax.block_until_ready(out)


def put_local_batch(batch: Any, mesh: Mesh) -> Any:
    """A host batch of this process's samples (per-device batch x local devices) split over
    its mesh devices, as one global array across every process (any tree of arrays: a dict,
    a user's (inputs, targets))."""
    sharding = batch_sharding(mesh)
    return jax.tree.map(lambda v: jax.make_array_from_process_local_data(sharding, v), batch)


def fsdp_shardings(tree: Any, mesh: Mesh) -> Any:
    """parallel=fsdp: each array split over the ``"data"`` axis along its largest dimension that
    the device count divides (ZeRO-3 / FSDP: parameters, gradients and optimiser state each
    held 1/N per device); arrays with no such dimension (scalars, small biases) replicated."""
    n = mesh.devices.size

    def spec(x: Any) -> NamedSharding:
        shape = getattr(x, "shape", ())
        dims = [i for i, d in enumerate(shape) if d >= n and d % n == 0]
        if n == 1 or not dims:
            return replicated(mesh)
        i = max(dims, key=lambda i: shape[i])
        return NamedSharding(mesh, P(*([None] * i), AXIS))

    return jax.tree.map(spec, tree)


def fsdp(state: Any, mesh: Mesh, step: Callable, batch: NamedSharding,
         donate: bool = True) -> tuple[Any, Callable]:
    """The state placed shard by shard and ``step(state, batch)`` jitted with the state sharded
    in and out: XLA's SPMD partitioner all-gathers each weight where it is used and
    reduce-scatters the gradients (the FSDP schedule, chosen by the compiler). Always jitted:
    the sharded step has no op-by-op form."""
    shardings = fsdp_shardings(state, mesh)
    if all(s.is_fully_addressable for s in jax.tree.leaves(shardings)):
        placed = jax.device_put(state, shardings)
    else:  # many processes: each fills its own devices' shards from its (identical) copy
        placed = jax.tree.map(lambda x, s: jax.make_array_from_callback(
            np.shape(x), s, lambda index: np.asarray(x)[index]), state, shardings)
    jitted = jax.jit(step, donate_argnums=0 if donate else (), in_shardings=(shardings, batch),
                     out_shardings=(shardings, replicated(mesh)))
    return placed, jitted


def state_bytes_per_device(state: Any) -> int:
    """Bytes of ``state`` on the fullest of this process's devices, shard by shard (a replicated
    array counts in full on each device, an FSDP-sharded one by its slice)."""
    per_device: dict[Any, int] = {}
    for x in jax.tree.leaves(state):
        for shard in x.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    return max(per_device.values(), default=0)


def reduce_max(value: float) -> float:
    """The largest ``value`` over every process (a collective: all processes call it)."""
    if jax.process_count() == 1:
        return value
    gathered = multihost_utils.process_allgather(np.asarray(value, np.float64))  # (processes,)
    return float(np.max(gathered))
