"""fairpool as ZenML's resource-pool reconciler (ZenML 0.95-0.96, "resource pools v1").

ZenML ships the whole resource-pool surface (models, REST routes, CLI, DB tables) but no
implementation behind it. :class:`FairpoolResourcePools` is that implementation: ZenML's own
tables hold the state, fairpool's pure engine decides. Plug it in with one of

* a ZenML server: ``ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE=`` :data:`SOURCE`;
* an in-process (local SQLite) store: :func:`enable` before running a pipeline.

The ``fairpool_local`` orchestrator flavor (:mod:`.orchestrator`, registered from
:data:`FLAVOR_SOURCE`) runs resource steps in their own processes so a preemption stops them.

``import fairpool`` never imports ZenML, nor does importing this package: ``enable`` and
``FairpoolResourcePools`` load it on first use (``fairpool zenml`` must start without it).
"""

from __future__ import annotations

import importlib
from typing import Any

#: The value for ``ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE``.
SOURCE = "fairpool.integrations.zenml.store.FairpoolResourcePools"
#: The orchestrator flavor, for ``zenml orchestrator flavor register``.
FLAVOR_SOURCE = "fairpool.integrations.zenml.orchestrator.FairpoolLocalOrchestratorFlavor"

__all__ = ["FLAVOR_SOURCE", "SOURCE", "FairpoolResourcePools", "enable"]


def __getattr__(name: str) -> Any:
    if name in ("FairpoolResourcePools", "enable"):
        # importlib: the main project's type check (no ZenML there) must not follow it.
        return getattr(importlib.import_module(f"{__name__}.store"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
