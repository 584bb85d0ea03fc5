"""The PyTorch Backend: wires models, data, devices and the training step together (the
optional capabilities are modules of this package: fxtrack.frameworks.torch.FRAMEWORK)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from fxtrack import families, policy
from fxtrack.frameworks.base import Backend, PeakMemory, attention_tokens
from fxtrack.frameworks.torch import FRAMEWORK, data, devices, models, parallel, train


class TorchBackend(Backend):
    name = "torch"

    def version(self) -> str:
        return torch.__version__

    def device_kind(self) -> str:
        if not hasattr(self, "device"):  # the first call: the fairness policy, before any build
            threads = policy.threads_per_process(policy.cpu_threads(self.spec.cpu_threads))
            self.policy_tags = devices.configure(self.spec.precision, threads)
            self.device = devices.select(self.spec.hardware)
        return "gpu" if self.device.type == "cuda" else "cpu"

    def device_tags(self) -> dict[str, str]:
        tags = {**devices.tags(self.device), **getattr(self, "policy_tags", {})}
        if hasattr(self, "model"):  # what the built model ran
            tags["compile_mode"] = self.framework.compile_mode_tag(
                self.spec.compile, self.spec.framework_settings)
            builder = models.BUILDERS.get(self.arch.family)  # None: a user's model
            if builder is not None and builder.attention is not None:
                dtype = train.AMP_DTYPES[self.spec.precision] or torch.float32
                llama = builder.attention == "causal_gqa"
                tokens = attention_tokens(self.arch)
                # a decoding scenario prefills its prompt, not seq_len (the worker types the
                # options; a spec made by hand may hold the JSON dict)
                options = self.spec.options
                prompt = (options.get("prompt_len") if isinstance(options, dict)
                          else getattr(options, "prompt_len", None))
                if prompt is not None:
                    tokens = int(prompt)
                tags["attention"] = devices.sdpa_backend(
                    self.arch.heads, tokens, self.arch.hidden // self.arch.heads,
                    dtype, self.device, self.arch.kv_heads if llama else None, causal=llama)
        return tags

    def reduce_max(self, value: float) -> float:
        return parallel.reduce_max(value, self.device)

    def visible_devices(self) -> list[str]:
        return devices.visible()

    def build(self, batch_size: int) -> None:
        own = families.of(self.arch).user
        if own is not None:  # a model its own builder makes (model=custom), the same step
            return self.capability(own.builder_capability).build(self, batch_size)
        torch.manual_seed(self.spec.seed)
        # Channels-last lets cuDNN / oneDNN use their NHWC convolution kernels.
        self.channels_last = channels_last = models.BUILDERS[self.arch.family].convolutional
        model = models.build(self.arch).to(self.device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        model.train()
        if self.spec.memory == "checkpoint":  # activations recomputed per block in backward
            models.checkpoint_blocks(model.blocks)
        self.model = model
        # Each data-parallel rank trains on its own shard: same seed, offset by rank.
        self.batch = data.device_batch(self.arch, batch_size, self.spec.seed + parallel.rank(),
                                       self.device, channels_last)
        wrapped = parallel.wrap(model, self.device, self.spec.parallel)
        # After wrapping: parallel=fsdp replaces the parameters by this rank's shards.
        self.opt = train.optimizer(model, self.arch, self.device,
                                   batch_size * parallel.world_size())
        # Model and loss compiled together: one graph from the input to the fp32 loss.
        self.loss = train.forward_loss(wrapped, self.spec.precision, self.device)
        if self.spec.compile:
            self.loss = train.compile_loss(self.loss, FRAMEWORK.setting(self.spec, "compile_mode"))
        self._step = train.make_step(self.loss, self.opt, self.spec.precision, self.device,
                                     functools.partial(devices.sync, self.device))

    def param_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def use_step(self, step: Callable[[Any], torch.Tensor]) -> None:
        """Train with ``step`` (batch -> loss), made for a model this backend's build did not
        make (model=custom: the ``user_model`` capability)."""
        self._step = step

    def train_on(self, batch: Any) -> torch.Tensor:
        """One training step on ``batch`` (on the device: the resident one, or a loader's moved
        there); the loss, once the step has finished."""
        return self._step(batch)

    def train_step(self) -> torch.Tensor:
        return self.train_on(self.batch)

    def state_bytes_per_device(self) -> Optional[int]:
        return parallel.local_state_bytes(self.model, self.opt)  # one device per rank

    def loss_value(self, handle: Any) -> float:
        return float(handle)

    def peak_memory(self) -> Optional[PeakMemory]:
        return devices.peak_memory(self.device)
