"""A ZenML dynamic pipeline whose GPU steps are queued and granted by fairpool.

Each ``train`` step carries ``ResourceSettings(gpu_count=1)``; in a dynamic pipeline ZenML
turns that into a resource request whose requester is the stack's orchestrator (or the step's
step operator), the component a pool policy names. fairpool (the ZenML server's resource-pool
implementation, or ``enable()`` in-process) grants it, queues it, rejects it or preempts for
it. On the ``fairpool_local`` orchestrator each such step runs in its own process, so a
preemption interrupts it; on the stock ``local`` one it runs inline.

    python examples/zenml/pipeline.py [--models a,b,c] [--seconds 10]

``examples/zenml/run.sh`` (``make zenml-demo``) sets up a server, a pool and a policy, and
runs it. Without a server, call ``fairpool.integrations.zenml.enable()`` before running the
pipeline (and make the pool and policy with ``Client()`` in that process).
"""

from __future__ import annotations

import argparse
import time

from zenml import pipeline, step
from zenml.config import ResourceSettings


@step(settings={"resources": ResourceSettings(gpu_count=1)})
def train(model: str, seconds: float) -> str:
    """One GPU for ``seconds``, in short slices of work as a training loop would (a
    preemption's interrupt lands between two of them)."""
    started = time.time()
    while time.time() - started < seconds:
        time.sleep(0.1)
    return f"{model}: trained for {seconds:.0f} s"


@step
def report(results: list[str]) -> None:
    """No resource settings: a request for ``step_run: 1`` only (every step of a dynamic
    pipeline has one), run inline in the pipeline's process."""
    for line in results:
        print(line)


@pipeline(dynamic=True, enable_cache=False)
def training_sweep(models: list[str], seconds: float) -> None:
    """All models at once: the pool's policy decides how many train together."""
    runs = [train.submit(model, seconds, id=f"train_{model}") for model in models]
    report([run.load() for run in runs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="small,medium,large")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    training_sweep(models=args.models.split(","), seconds=args.seconds)


if __name__ == "__main__":
    main()
