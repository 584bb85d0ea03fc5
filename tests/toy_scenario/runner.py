"""The toy's worker runner: reads its typed options, steps the stand-in backend."""

from fxtrack import scenarios


def run(backend, result) -> None:
    options = scenarios.options_of(backend.spec)
    backend.build(2)
    for _ in range(options.widgets):
        backend.train_step()
    result.metrics["toy_widgets"] = float(options.widgets)
    result.metrics["toy_loss"] = backend.loss
