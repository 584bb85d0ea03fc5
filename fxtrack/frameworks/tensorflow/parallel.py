"""Data parallelism for TensorFlow through ``tf.distribute``: MirroredStrategy over the devices
of one machine (GPUs, or logical CPU devices standing in for them), MultiWorkerMirroredStrategy
across nodes (configured by a ``TF_CONFIG`` built from the job spec)."""

from __future__ import annotations

import json
import os
from typing import ContextManager

import tensorflow as tf

from fxtrack.frameworks.declaration import NotSupported
from fxtrack.frameworks.tensorflow import ONE_REPLICA_PER_CPU_WORKER
from fxtrack.worker.protocol import JobSpec


def create(spec: JobSpec, device: str) -> tf.distribute.Strategy:
    """The strategy for ``spec.devices`` devices per node on ``device``'s kind (``"/GPU:0"`` or
    ``"/CPU:0"``) and ``spec.nodes`` nodes; the default (no-op) strategy for one device.

    Must run before anything initialises TensorFlow's devices (any op, any variable): logical
    CPU devices and the multi-worker runtime can only be configured before that. parallel=fsdp
    never gets here: TensorFlow declares no ``sharded_state`` (its __init__.py says why)."""
    n, gpu = spec.devices, "GPU" in device
    if not gpu and n > 1:  # N logical CPU devices stand in for N accelerators
        cpus = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
    if gpu:
        gpus = tf.config.list_physical_devices("GPU")
        if n > len(gpus):
            raise RuntimeError(f"devices={n}, but TensorFlow sees only {len(gpus)} GPU(s)")
        tf.config.set_visible_devices(gpus[:n], "GPU")  # multi-worker uses every visible GPU
    if spec.nodes > 1:
        return _multi_worker(spec, gpu)
    if n == 1:
        return tf.distribute.get_strategy()
    kind = "GPU" if gpu else "CPU"
    return tf.distribute.MirroredStrategy([f"/{kind}:{i}" for i in range(n)])


def _multi_worker(spec: JobSpec, gpu: bool) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy: node i's worker listens on the coordinator's host at
    port + i; collectives (all-reduce of the gradients) run over gRPC between the workers."""
    if not gpu and spec.devices > 1:
        # MultiWorkerMirroredStrategy places exactly one replica on a worker without GPUs.
        raise NotSupported("hardware.nodes > 1 with devices > 1 on a CPU is not supported by "
                           f"tensorflow {tf.__version__}: {ONE_REPLICA_PER_CPU_WORKER}")
    host, _, port = spec.coordinator.rpartition(":")
    workers = [f"{host}:{int(port) + i}" for i in range(spec.nodes)]
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers},
                                          "task": {"type": "worker", "index": spec.node_rank}})
    return tf.distribute.MultiWorkerMirroredStrategy()  # blocks until every worker has joined


def placement(strategy: tf.distribute.Strategy, device: str) -> ContextManager:
    """Where variables and steps go: the strategy's scope (variables mirrored on every replica)
    when distributed, else the one device."""
    if strategy.num_replicas_in_sync > 1:
        return strategy.scope()
    return tf.device(device)


def replica_devices(strategy: tf.distribute.Strategy, device: str) -> list[str]:
    """The devices of this process that hold a replica, as ``"/GPU:1"`` (the memory counter's
    naming, not the strategy's ``/job:worker/replica:0/task:0/device:GPU:1``)."""
    if strategy.num_replicas_in_sync == 1:
        return [device]
    specs = [tf.DeviceSpec.from_string(d) for d in strategy.extended.worker_devices]
    return [f"/{s.device_type}:{s.device_index}" for s in specs]


def reduce_max(strategy: tf.distribute.Strategy, value: float) -> float:
    """The largest ``value`` over the workers (a collective: every worker calls it). Gathered,
    then reduced locally: the collective all-reduce offers only SUM and MEAN."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        values = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant([value], tf.float64))
        return float(tf.reduce_max(strategy.gather(values, axis=0)))  # (replicas,) -> ()
    return value
