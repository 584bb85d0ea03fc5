"""Profile one training step of an arm of bench/reference.py: fxtrack's model in a framework, or
the public reference it is timed against, built exactly as that bench builds it (the same
config, batch, optimiser, precision and mode), with ``torch.profiler``: ops per step and the top
ops by self CPU time. For finding why one arm's step is slower than another's (issue 35).

    PYTHONPATH=. python bench/profile_step.py --row vit-torch --arm fxtrack --precision bf16
    PYTHONPATH=. python bench/profile_step.py --row vit-torch --arm reference --mode eager
    PYTHONPATH=. python bench/profile_step.py --row llama-torch --arm fxtrack --mode false
    PYTHONPATH=. python bench/profile_step.py --row llama-torch --precision bf16 --full \
        --seq-len 256 --batch 1 --steps 1 --shapes   # bench/mfu.py's 1B Llama cell

torch rows and ``framework=keras`` on the torch backend (``--row vit-keras-torch``; the
reference is keras-hub's on the same backend) only: the profiler is torch's.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent


def reference_bench():
    spec = importlib.util.spec_from_file_location("reference", HERE / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ref = reference_bench()
    # every row whose steps run torch ops: torch's own, and framework=keras on the torch backend
    torch_rows = [r for r, row in ref.ROWS.items()
                  if row[1] == "torch" or ref.keras_backend(r) == "torch"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", choices=torch_rows, default="llama-torch")
    parser.add_argument("--arm", choices=("fxtrack", "reference"), default="fxtrack")
    parser.add_argument("--mode", default=None, help="fxtrack: auto (default), true, false; "
                        "reference: eager (default) or compile")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--steps", type=int, default=2, help="profiled steps (after 3 warm-up)")
    parser.add_argument("--rows", type=int, default=16, help="table rows")
    parser.add_argument("--full", action="store_true",
                        help="the model's canonical size, not reference.py's smaller one")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=None, help="the row's batch otherwise")
    parser.add_argument("--shapes", action="store_true",
                        help="one table row per op and input shapes (which products are slow)")
    args = parser.parse_args()

    model, framework, reference, default, _, _ = ref.ROWS[args.row]
    dims = {} if args.full else dict(ref.SIZES[model])
    if args.image_size and "image_size" in dims:
        dims["image_size"] = args.image_size
    if args.seq_len:
        dims["seq_len"] = args.seq_len
    arm = dict(kind=args.arm, model=model, framework=framework, dims=dims,
               batch=args.batch or ref.BATCHES.get(model, ref.BATCH), warmup=3,
               precision=args.precision,
               reference=reference, mode=args.mode or ("auto" if args.arm == "fxtrack" else default))
    if framework == "keras":
        arm["keras_backend"] = "torch"

    from fxtrack.worker.__main__ import prepare_environment

    arch, spec = ref.job(arm)
    prepare_environment(spec)  # threads, as every arm of the bench gets them
    import torch
    from torch.profiler import ProfilerActivity, profile

    reference_step = ref.keras_reference_step if framework == "keras" else ref.torch_reference_step
    build = ref.fxtrack_step if args.arm == "fxtrack" else reference_step
    step, mode = build(arm, arch, spec)
    for _ in range(arm["warmup"]):
        step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=args.shapes,
                 with_flops=args.shapes) as prof:
        for _ in range(args.steps):
            step()
    events = prof.key_averages(group_by_input_shape=args.shapes)
    print(f"{args.row} {args.arm} ({mode}, {args.precision}, batch {arm['batch']}, {dims}): "
          f"{sum(e.count for e in events) // args.steps} ops/step, "
          f"{torch.get_num_threads()} threads")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows,
                       max_shapes_column_width=60 if args.shapes else 80))


if __name__ == "__main__":
    main()
