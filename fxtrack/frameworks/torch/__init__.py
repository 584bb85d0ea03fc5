"""PyTorch: what it declares (no torch import here; fxtrack.frameworks.declaration)."""

from fxtrack.frameworks.declaration import CompileRule, Framework, Limit, Setting

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")  # torch.compile(mode=...)
# Refused before any work (the Limit below) and by deployment.quantize_native as a backstop.
INT8_CPU_ONLY = "its dynamic int8 kernels are CPU-only; use hardware=cpu or runtime=onnxruntime"

# Where each compile rule's figure, interval, machine and command live (or its source)
TORCH_CPU = "docs/measurements.md#torchcompile-on-cpu-2026-11-30"
PER_FAMILY = "docs/measurements.md#compileauto-per-model-family-and-compiletune-2026-12-01"
PEER = ("docs/measurements.md#pytorch-at-its-peer-the-llama-and-vit-rows-of-the-reference-bench"
        "-2026-12-02")
AUTO = "docs/fairness.md#what-frameworkcompileauto-means-each-fxtrackframeworksfw__init__py"
BF16 = "docs/measurements.md#bf16-on-a-cpu-the-compile-rule-and-the-reference-rows-2026-12-03"
LLAMA_BF16 = "docs/measurements.md#torchcompile-for-the-1b-llama-at-bf16-on-a-cpu-2026-12-06"

FRAMEWORK = Framework(
    name="torch",
    words="PyTorch",
    backend="fxtrack.frameworks.torch.backend:TorchBackend",
    extra="torch",
    report_order=10,
    colour="#ee4c2c",
    # framework.compile=auto per device kind and model family, the first match wins; every
    # row links the docs section holding its figure, interval, machine and command
    compile_rules=(
        CompileRule(True, "torch.compile on GPU", AUTO, device_kind="gpu"),
        CompileRule(False, "eager on CPU for ResNet-50: no consistent gain, minutes of compile",
                    TORCH_CPU, device_kind="cpu", family="resnet"),
        CompileRule(True, "torch.compile on CPU for ViT at bf16 and 64-128 px: faster than "
                          "eager at the reference config", BF16, device_kind="cpu",
                    family="vit", sizes={"image_size": (64, 129)}, precisions=("bf16",)),
        CompileRule(False, "eager on CPU for ViT: measured a tie with torch.compile",
                    PER_FAMILY, device_kind="cpu", family="vit"),
        CompileRule(True, "torch.compile on CPU for BERT at bf16 and 128-512 tokens: faster "
                          "than eager at the reference config", BF16, device_kind="cpu",
                    family="bert", sizes={"seq_len": (128, 513)}, precisions=("bf16",)),
        CompileRule(False, "eager on CPU for BERT: no clear gain from torch.compile",
                    PER_FAMILY, device_kind="cpu", family="bert"),
        CompileRule(True, "torch.compile on CPU for a Llama of hidden 256-767: faster at the "
                          "reference config", PEER, device_kind="cpu", family="llama",
                    sizes={"hidden": (256, 768)}),
        CompileRule(True, "torch.compile on CPU for a Llama of hidden 2048 (the 1B dims) at bf16: "
                          "faster than eager in bench/mfu.py's cell", LLAMA_BF16,
                    device_kind="cpu", family="llama", sizes={"hidden": (2048, 2049)},
                    precisions=("bf16",)),
        CompileRule(False, "eager on CPU for a Llama at other widths: ties at ViT-B widths, and "
                           "tiny runs are too short to repay a compile",
                    PEER, device_kind="cpu", family="llama"),
        CompileRule(False, "eager on CPU for a user's model: no consistent CPU gain measured "
                           "(framework.compile=tune times both)",
                    TORCH_CPU, device_kind="cpu", family="custom"),
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
        "user_sharded_state": "fxtrack.frameworks.torch.user_model",
        "user_remat": "fxtrack.frameworks.torch.user_model",
        "generate": "fxtrack.frameworks.torch.generate",
        "serve_buckets": "fxtrack.frameworks.torch.buckets",
        "slot_decode": "fxtrack.frameworks.torch.slots",
        "converge": "fxtrack.frameworks.torch.converge",
        "converge_devices": "fxtrack.frameworks.torch.converge",
        "profile": "fxtrack.frameworks.torch.profile",
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
