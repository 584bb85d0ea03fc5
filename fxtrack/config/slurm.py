"""Multi-node settings from SLURM's environment.

Inside a SLURM job, ``hardware.nodes``, ``hardware.node_rank`` and ``hardware.coordinator`` default
to what SLURM says about the job, each one only when it is not given: the node count
(``SLURM_NNODES``), this node's index (``SLURM_NODEID``) and the first host of the job's node list
(``SLURM_JOB_NODELIST``, e.g. ``gpu[01-04],login2``) with port 29500, torchrun's default. All three
frameworks read these through the job spec (torchrun's rendezvous, ``jax.distributed``'s
coordinator, TensorFlow's ``TF_CONFIG``). Outside SLURM the defaults are one node, rank 0 and no
coordinator. The config schema reads them through the ``fx.slurm`` resolver (``setting``), so the
values are taken in the process that runs the job, on its node.

Start one fxtrack per node (``srun --ntasks-per-node=1``, or ``hydra/launcher=slurm`` with
``hydra.launcher.nodes``): a node that is counted but never started leaves node 0 waiting.
"""

from __future__ import annotations

import os
import re
from typing import Mapping, Optional, Union

COORDINATOR_PORT = 29500  # torchrun's default rendezvous port; override with hardware.coordinator
_RANGE_GROUP = re.compile(r"^([^\[]*)\[([^\]]*)\](.*)$")


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compressed host list in full: ``"node[01-03,7],x"`` -> node01 node02 node03 node7 x.
    Zero padding is kept; several bracket groups in one name (``a[1-2]-b[1-2]``) multiply."""
    hosts: list[str] = []
    for item in _split_outside_brackets(nodelist.strip()):
        hosts.extend(_expand(item))
    return hosts


def _split_outside_brackets(text: str) -> list[str]:
    items, depth, current = [], 0, []
    for ch in text:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    return [item for item in items if item]


def _expand(name: str) -> list[str]:
    match = _RANGE_GROUP.match(name)
    if not match:
        return [name]
    prefix, ranges, rest = match.groups()
    tails = _expand(rest)
    hosts = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        width = len(low)  # "01-04": two digits, zero-padded
        for index in range(int(low), int(high or low) + 1):
            hosts.extend(f"{prefix}{index:0{width}d}{tail}" for tail in tails)
    return hosts


def nodes(env: Optional[Mapping[str, str]] = None) -> int:
    env = os.environ if env is None else env
    return int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 1)


def node_rank(env: Optional[Mapping[str, str]] = None) -> int:
    env = os.environ if env is None else env
    return int(env.get("SLURM_NODEID") or 0)


def coordinator(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``host:port`` of node 0 (the first host of the job's node list), or None outside SLURM."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    return f"{expand_nodelist(nodelist)[0]}:{COORDINATOR_PORT}"


def setting(key: str) -> Union[int, str, None]:
    """The ``fx.slurm`` resolver: ``${fx.slurm:nodes}``, ``node_rank`` or ``coordinator``."""
    readers = {"nodes": nodes, "node_rank": node_rank, "coordinator": coordinator}
    if key not in readers:
        raise ValueError(f"fx.slurm: unknown setting {key!r} (known: {', '.join(readers)})")
    return readers[key]()
