"""``fairpool zenml install``: what a ZenML installation needs to run on fairpool, idempotent.

On the ZenML store the client is connected to (a server, or the local SQLite store):

* registers the ``fairpool_local`` orchestrator flavor (``zenml orchestrator flavor
  register``), or updates it when its registered source differs;
* registers an orchestrator of that flavor (default name ``fairpool``) unless one with that
  name exists;
* optionally registers a stack with it (the active stack's other components) and activates
  it;
* reports whether the store has fairpool as its resource-pool implementation, and if not,
  the steps that plug it in (they are the server's environment, which a client cannot set).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zenml.client import Client
from zenml.enums import StackComponentType
from zenml.exceptions import IllegalOperationError
from zenml.zen_stores.sql_zen_store import SqlZenStore

from fairpool.integrations.zenml import FLAVOR_SOURCE, SOURCE
from fairpool.integrations.zenml.orchestrator import FLAVOR, FairpoolLocalOrchestratorFlavor
from fairpool.integrations.zenml.store import FairpoolResourcePools

ENV_SOURCE = "ZENML_SERVER_RESOURCE_POOL_IMPLEMENTATION_SOURCE"


@dataclass
class Report:
    """What ``install`` did (``done``) and what is left to the user (``todo``)."""

    done: list[str] = field(default_factory=list)
    todo: list[str] = field(default_factory=list)


def install(
    orchestrator: str | None = "fairpool", stack: str | None = None, activate: bool = False
) -> Report:
    client = Client()
    report = Report()
    orchestrator_type = StackComponentType.ORCHESTRATOR
    if stack and not orchestrator:
        raise ValueError("--stack needs an orchestrator")
    # Refused before anything is registered: a stack of that name on another orchestrator
    # (any other stack of that name would run its steps elsewhere, and --set activate it).
    found = client.list_stacks(name=stack, size=1).items if stack else []
    if found:
        held = client.get_stack(found[0].id).components.get(orchestrator_type) or []
        if orchestrator not in [component.name for component in held]:
            raise ValueError(
                f"a stack named {stack!r} exists with orchestrator "
                f"{', '.join(c.name for c in held) or 'none'}, not {orchestrator!r}: "
                "choose another --stack"
            )

    try:
        registered = client.get_flavor_by_name_and_type(FLAVOR, orchestrator_type)
    except KeyError:
        registered = None
    # What `zenml orchestrator flavor register FLAVOR_SOURCE` stores, with the source as
    # given: ZenML would resolve the class relative to this process's source root, which is
    # the package itself when run as `python -m fairpool.integrations.zenml.cli`.
    model = FairpoolLocalOrchestratorFlavor().to_model(integration="custom", is_custom=True)
    model = model.model_copy(update={"source": FLAVOR_SOURCE})
    if registered is None:
        client.zen_store.create_flavor(model)
        report.done.append(f"registered the orchestrator flavor {FLAVOR} ({FLAVOR_SOURCE})")
    elif registered.source != FLAVOR_SOURCE:
        # A flavor's source cannot be updated, and one used by components cannot be deleted.
        try:
            client.zen_store.delete_flavor(registered.id)
        except IllegalOperationError as error:
            report.todo.append(
                f"the orchestrator flavor {FLAVOR} is registered from {registered.source!r}, "
                f"not {FLAVOR_SOURCE!r}, and cannot be replaced: {error}"
            )
        else:
            client.zen_store.create_flavor(model)
            report.done.append(f"re-registered the orchestrator flavor {FLAVOR} ({FLAVOR_SOURCE})")
    else:
        report.done.append(f"orchestrator flavor {FLAVOR}: already registered")

    if orchestrator:
        existing = client.list_stack_components(
            type=orchestrator_type, name=orchestrator, size=1
        ).items
        if not existing:
            client.create_stack_component(
                name=orchestrator, flavor=FLAVOR, component_type=orchestrator_type,
                configuration={},
            )
            report.done.append(f"registered the orchestrator {orchestrator} ({FLAVOR})")
        elif existing[0].flavor_name != FLAVOR:
            raise ValueError(
                f"an orchestrator named {orchestrator!r} exists with flavor "
                f"{existing[0].flavor_name!r}, not {FLAVOR!r}: choose another --orchestrator"
            )
        else:
            report.done.append(f"orchestrator {orchestrator}: already registered")

    if stack and orchestrator:
        if not found:
            components: dict[StackComponentType, str] = {
                kind: str(models[0].id)
                for kind, models in client.active_stack_model.components.items()
                if models and kind != orchestrator_type
            }
            components[orchestrator_type] = orchestrator
            client.create_stack(name=stack, components=components)
            report.done.append(
                f"registered the stack {stack}: the active stack's components, orchestrator "
                f"{orchestrator}"
            )
        else:
            report.done.append(f"stack {stack}: already registered")
        if activate:
            client.activate_stack(stack)
            report.done.append(f"activated the stack {stack}")

    store = client.zen_store
    if isinstance(store, SqlZenStore):
        if isinstance(store._resource_pools, FairpoolResourcePools):
            report.done.append("this process's store runs fairpool")
        else:
            report.todo.append(
                "local store (no server): call fairpool.integrations.zenml.enable() in the "
                "process that runs the pipeline, or use a local server:"
            )
            report.todo.append(f"  export {ENV_SOURCE}={SOURCE}")
            report.todo.append("  zenml login --local --ip-address 127.0.0.1")
            report.todo.append("  fairpool zenml install        # again: the server's store")
    else:
        try:
            client.list_resource_pools(size=1)
        except Exception as error:  # the server answers 501 without an implementation
            report.todo.append(
                f"the ZenML server has no resource-pool implementation ({error}); start it "
                "with fairpool installed in its environment and"
            )
            report.todo.append(f"  {ENV_SOURCE}={SOURCE}")
            report.todo.append(
                "  (local server: export it, then zenml login --local --restart)"
            )
        else:
            report.done.append("the ZenML server has a resource-pool implementation")
    return report
