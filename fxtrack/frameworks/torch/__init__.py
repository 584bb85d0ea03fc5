"""PyTorch: what it declares (no torch import here; fxtrack.frameworks.declaration)."""

from fxtrack.frameworks.declaration import CompileRule, Framework, Limit

# Why eager on a CPU: docs/measurements.md ("torch.compile on CPU"), with the figures and command.
CPU_COMPILE_NOTE = "no consistent CPU step-time gain measured, 0.5-4 min compile"
# Refused before any work (the Limit below) and by deployment.quantize_native as a backstop.
INT8_CPU_ONLY = "its dynamic int8 kernels are CPU-only; use hardware=cpu or runtime=onnxruntime"

FRAMEWORK = Framework(
    name="torch",
    backend="fxtrack.frameworks.torch.backend:TorchBackend",
    extra="torch",
    report_order=10,
    compile_rules=(
        CompileRule(True, "torch.compile on GPU", device_kind="gpu"),
        CompileRule(False, f"eager on CPU ({CPU_COMPILE_NOTE})", device_kind="cpu"),
    ),
    compiled_tag="inductor:{compile_mode}",
    uncompiled_tag="eager",
    capabilities={
        "inference": "fxtrack.frameworks.torch.inference",
        "pipeline": "fxtrack.frameworks.torch.pipeline",
        "checkpoint": "fxtrack.frameworks.torch.checkpoint",
        "serving_export": "fxtrack.frameworks.torch.serving",
        "onnx_export": "fxtrack.frameworks.torch.deployment",
        "native_int8": "fxtrack.frameworks.torch.deployment",
        "sharded_state": "fxtrack.frameworks.torch.parallel",
        "remat": "fxtrack.frameworks.torch.models",
        "calibration": "fxtrack.frameworks.torch.devices",
        "user_model": "fxtrack.frameworks.torch.user_model",
        "generate": "fxtrack.frameworks.torch.generate",
    },
    limits=(
        Limit("quantize=dynamic_int8 with runtime=native on a GPU",
              lambda c: (c.quantize, c.runtime, c.device_kind) == ("dynamic_int8", "native", "gpu"),
              INT8_CPU_ONLY),
    ),
    absent={
        "tflite_export": "TFLite export is TensorFlow's (ai-edge-torch would convert through "
                         "TensorFlow); use runtime=onnxruntime",
    },
)
