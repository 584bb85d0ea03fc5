"""PyTorch: what it declares (no torch import here; fxtrack.frameworks.declaration)."""

from fxtrack.frameworks.declaration import CompileRule, Framework, Limit, Setting

# Why eager on a CPU: docs/measurements.md ("torch.compile on CPU"), with the figures and command.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")  # torch.compile(mode=...)
CPU_COMPILE_NOTE = "no consistent CPU step-time gain measured, 0.5-4 min compile"
# Refused before any work (the Limit below) and by deployment.quantize_native as a backstop.
INT8_CPU_ONLY = "its dynamic int8 kernels are CPU-only; use hardware=cpu or runtime=onnxruntime"

FRAMEWORK = Framework(
    name="torch",
    backend="fxtrack.frameworks.torch.backend:TorchBackend",
    extra="torch",
    report_order=10,
    # framework.compile=auto per device kind and model family, the first match wins; every
    # measured row names its figure and command (docs/measurements.md, "compile=auto per family")
    compile_rules=(
        CompileRule(True, "torch.compile on GPU", device_kind="gpu"),
        CompileRule(False, "eager on CPU for ResNet-50 (measured: no consistent gain, 244 s "
                           "compile, docs/measurements.md; python bench/compile_modes.py "
                           "--families resnet)", device_kind="cpu", family="resnet"),
        CompileRule(False, "eager on CPU for ViT (measured a tie: 15.4 eager vs 15.1 "
                           "torch.compile samples/s, ViT-B widths, 4 layers, 64 px, batch 8, "
                           "issue 26; python bench/compile_modes.py --families vit)",
                    device_kind="cpu", family="vit"),
        CompileRule(False, "eager on CPU for BERT (no clear gain: tiny BERT's torch.compile "
                           "step 0.72x [0.17, 4.94] eager's after a 48 s compile, contended: "
                           "python bench/compile_modes.py --families bert)",
                    device_kind="cpu", family="bert"),
        CompileRule(True, "torch.compile on CPU for a Llama of hidden 256-767 (measured 0.84x "
                           "[0.82, 0.87] eager's step time at bench/reference.py's config, "
                           "hidden 256, after a 7.5 s compile, docs/measurements.md; python "
                           "bench/compile_modes.py --families llama --reference)",
                    device_kind="cpu", family="llama", sizes={"hidden": (256, 768)}),
        CompileRule(False, f"eager on CPU for Llama at other widths ({CPU_COMPILE_NOTE} on ViT "
                           "at ViT-B widths and ResNet-50; tiny widths keep the short CPU runs "
                           "free of a compile; python bench/compile_modes.py --families llama)",
                    device_kind="cpu", family="llama"),
        CompileRule(False, f"eager on CPU for a user's model ({CPU_COMPILE_NOTE}; "
                           "framework.compile=tune times both)", device_kind="cpu",
                    family="custom"),
    ),
    compiled_tag="inductor:{compile_mode}",
    uncompiled_tag="eager",
    settings={
        "compile_mode": Setting("default", COMPILE_MODES,
                                "torch.compile mode: default | reduce-overhead | max-autotune"),
    },
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
        "user_serving_export": "fxtrack.frameworks.torch.user_model",
        "generate": "fxtrack.frameworks.torch.generate",
        "serve_buckets": "fxtrack.frameworks.torch.buckets",
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
