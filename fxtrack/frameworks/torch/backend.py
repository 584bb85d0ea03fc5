"""The PyTorch Backend: wires models, data, devices and the training step together."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from fxtrack.frameworks.base import Backend
from fxtrack.frameworks.torch import checkpoint, data, devices, models, parallel, pipeline, train


class TorchBackend(Backend):
    name = "torch"

    def version(self) -> str:
        return torch.__version__

    def device_kind(self) -> str:
        self.device = devices.select(self.spec.hardware)
        return "gpu" if self.device.type == "cuda" else "cpu"

    def device_tags(self) -> dict[str, str]:
        return devices.tags(self.device)

    def reduce_max(self, value: float) -> float:
        return parallel.reduce_max(value, self.device)

    def visible_devices(self) -> list[str]:
        return devices.visible()

    def build(self, batch_size: int) -> None:
        torch.manual_seed(self.spec.seed)
        # Channels-last lets cuDNN / oneDNN use their NHWC convolution kernels.
        self.channels_last = channels_last = self.arch.family == "resnet"
        model = models.build(self.arch).to(self.device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        model.train()
        self.model = model
        self.opt = train.optimizer(model, self.arch, self.device,
                                   batch_size * parallel.world_size())
        # Each data-parallel rank trains on its own shard: same seed, offset by rank.
        self.batch = data.device_batch(self.arch, batch_size, self.spec.seed + parallel.rank(),
                                       self.device, channels_last)
        wrapped = parallel.wrap(model, self.device)
        runnable = torch.compile(wrapped) if self.spec.compile else wrapped
        self._step = train.make_step(runnable, self.opt, self.spec.precision, self.device,
                                     functools.partial(devices.sync, self.device))

    def param_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def train_step(self) -> torch.Tensor:
        return self._step(self.batch)

    def pipeline_loader(self, directory: Path, batch_size: int, workers: int) -> Iterator[Any]:
        return pipeline.loader(directory, batch_size, workers, pin=self.device.type == "cuda")

    def train_step_on(self, batch: Any) -> torch.Tensor:
        return self._step(data.to_device(batch, self.device, self.channels_last))

    def loss_value(self, handle: Any) -> float:
        return float(handle)

    def peak_memory_bytes(self) -> Optional[int]:
        return devices.peak_memory_bytes(self.device)

    def prepare_inference(self) -> Callable[[], None]:
        self.model.eval()  # BatchNorm running statistics
        runnable = torch.compile(self.model) if self.spec.compile else self.model
        return train.make_inference_step(runnable, self.batch, self.spec.precision, self.device,
                                         functools.partial(devices.sync, self.device))

    def save_checkpoint(self, directory: Path) -> None:
        checkpoint.save(self.model, self.opt, directory)

    def restore_checkpoint(self, directory: Path) -> None:
        checkpoint.restore(self.model, self.opt, directory, self.device)

    def export(self, directory: Path) -> Callable[[], None]:
        path = checkpoint.export(self.model, train.model_input(self.batch), directory)
        served = checkpoint.load_exported(path)
        return train.make_inference_step(served, self.batch, self.spec.precision, self.device,
                                         functools.partial(devices.sync, self.device))

    def matmul_tflops(self) -> float:
        return devices.matmul_tflops(self.device, self.spec.precision)
