"""fairpool as ZenML's resource-pool reconciler (ZenML 0.95-0.96, "resource pools v1").

ZenML ships the whole resource-pool surface (models, REST routes, CLI, DB tables) but no
implementation behind it. :class:`FairpoolResourcePools` is that implementation: ZenML's own
tables hold the state, fairpool's pure engine decides. Plug it in with one of

* a ZenML server: ``ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE=`` :data:`SOURCE`;
* an in-process (local SQLite) store: :func:`enable` before running a pipeline.

Importing this package imports ZenML; ``import fairpool`` never does.
"""

from __future__ import annotations

from fairpool.integrations.zenml.store import SOURCE, FairpoolResourcePools, enable

__all__ = ["SOURCE", "FairpoolResourcePools", "enable"]
