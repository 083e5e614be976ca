"""``fairpool_local``: ZenML's local orchestrator, with each resource step of a dynamic
pipeline run as an ISOLATED step in its own process, so a preemption can stop it.

Why it exists: on the stock ``local`` flavor ZenML cannot interrupt a running step. Its
compiler turns the step heartbeat off for the flavor named ``local``
(``config/compiler.py: _get_heartbeat_flag``), and the local orchestrator has no
``submit_isolated_step``, so every step of a dynamic pipeline runs inline
(``execution/pipeline/dynamic/compilation.py: get_step_runtime``). fairpool sets a preempted
step run to ``CANCELLING``, which only a heartbeat or the dynamic runner's monitor acts on.

This flavor is ``LocalOrchestrator`` plus ZenML's isolated-step API
(``submit_isolated_step`` / ``get_isolated_step_status`` / ``stop_isolated_step``, the same
shape as ZenML's SSH orchestrator). ZenML then, by its own rules:

* runs a step of a dynamic pipeline that has ``ResourceSettings`` (or its own Docker
  settings, or ``runtime="isolated"``) ISOLATED: after its resource request is allocated
  (``step_launcher._wait_until_resources_acquired``, in the pipeline's process), a
  subprocess runs ZenML's step entrypoint (``StepOperatorEntrypointConfiguration``); steps
  without resource settings still run inline, as on ``local``;
* turns the heartbeat on for those steps (the flavor is not named ``local``): the step's
  ``StepHeartbeatWorker`` sees ``CANCELLING`` and interrupts the step
  (``_thread.interrupt_main()``, a ``KeyboardInterrupt`` in the step's code), the runner
  (its monitor, or the launcher for a step called without ``.submit``) publishes
  ``CANCELLED``, and fairpool's release hook marks the request ``preempted`` and grants
  the units to the preemptor.

What this module adds on top: the step process uses this Python (ZenML's default command
is a bare ``python``), the snapshot's stack, a configurable heartbeat interval (ZenML's is a
fixed 15 s class constant), fairpool plugged into the step process's store when the
pipeline's process runs fairpool in-process (``enable()``), a heartbeat that reads the step's
status when ZenML's heartbeat route fails (it does on a local server), ``zenml pipeline runs
stop``, and a hard stop: a step still running ``stop_grace_seconds`` after it was set to
``CANCELLING``/``STOPPING`` (its code is blocked in a call a ``KeyboardInterrupt`` cannot
break) has its process group terminated.

Register the flavor the ZenML way (``fairpool zenml install`` does all of it), with
``zenml orchestrator flavor register`` and :data:`FLAVOR_SOURCE`, then::

    zenml orchestrator register fairpool -f fairpool_local
    zenml stack register fairpool-stack -o fairpool -a default --set
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from pydantic import Field
from zenml.client import Client
from zenml.constants import (
    ENV_ZENML_ACTIVE_PROJECT_ID,
    ENV_ZENML_ACTIVE_STACK_ID,
    ENV_ZENML_CUSTOM_SOURCE_ROOT,
    ENV_ZENML_DYNAMIC_PIPELINE_MONITORING_INTERVAL,
)
from zenml.enums import ExecutionStatus
from zenml.logger import get_logger
from zenml.models import StepRunUpdate
from zenml.orchestrators import publish_utils
from zenml.orchestrators import utils as orchestrator_utils
from zenml.orchestrators.local.local_orchestrator import (
    LocalOrchestrator,
    LocalOrchestratorConfig,
    LocalOrchestratorFlavor,
)
from zenml.step_operators.step_operator_entrypoint_configuration import (
    STEP_RUN_ID_OPTION,
    StepOperatorEntrypointConfiguration,
)
from zenml.utils import source_utils
from zenml.utils.env_utils import temporary_environment
from zenml.utils.pagination_utils import depaginate

# The flavor's source, for ``zenml orchestrator flavor register`` (re-exported).
from fairpool.integrations.zenml import FLAVOR_SOURCE as FLAVOR_SOURCE

if TYPE_CHECKING:
    from zenml.config.step_run_info import StepRunInfo
    from zenml.models import PipelineRunResponse, PipelineSnapshotResponse, StepRunResponse
    from zenml.orchestrators import SubmissionResult
    from zenml.stack import Stack
    from zenml.zen_stores.sql_zen_store import SqlZenStore

logger = get_logger(__name__)

#: The flavor's name (``zenml orchestrator register NAME -f fairpool_local``).
FLAVOR = "fairpool_local"

#: Passed to a step's process: its heartbeat interval, and whether to plug fairpool into its
#: in-process store (set when the pipeline's process has).
ENV_HEARTBEAT_SECONDS = "FAIRPOOL_ZENML_HEARTBEAT_SECONDS"
ENV_ENABLE = "FAIRPOOL_ZENML_ENABLE"

_CANCELLING = (ExecutionStatus.CANCELLING, ExecutionStatus.STOPPING)
#: The statuses at which ZenML's heartbeat stops a step.
_STOPPED = (*_CANCELLING, ExecutionStatus.CANCELLED, ExecutionStatus.STOPPED)
_STARTED = (ExecutionStatus.INITIALIZING, ExecutionStatus.PROVISIONING, ExecutionStatus.RUNNING)
#: What a submitted step's future waits through: ZenML's (provisioning, running, retrying:
#: another step run comes), and stopping (see ``_wait_through_stopping``).
_STILL_GOING = (ExecutionStatus.PROVISIONING, ExecutionStatus.RUNNING, ExecutionStatus.RETRYING,
                *_CANCELLING)


class FairpoolLocalOrchestratorConfig(LocalOrchestratorConfig):
    """Configuration of the ``fairpool_local`` orchestrator."""

    heartbeat_interval_seconds: int = Field(
        default=2,
        ge=1,
        description="How often an isolated step's heartbeat asks ZenML whether the step was "
        "cancelled (preempted) or stopped; ZenML's own interval is 15 s.",
    )
    stop_grace_seconds: float = Field(
        default=30.0,
        ge=0,
        description="How long a step set to CANCELLING/STOPPING may take to stop by itself "
        "(its heartbeat interrupts it) before its process group is terminated.",
    )
    monitoring_interval_seconds: float = Field(
        default=1.0,
        gt=0,
        description="How often the dynamic runner checks its isolated steps (ZenML's "
        "default is 10 s); ZENML_DYNAMIC_PIPELINE_MONITORING_INTERVAL overrides it.",
    )


@dataclass
class _StepProcess:
    process: subprocess.Popen[bytes]
    stopped: bool = False
    cancelling_since: float | None = None
    ended_as: ExecutionStatus | None = None
    last_check: float = field(default=0.0)


#: Step processes of this Python process, by step run id. Module-level: ZenML may build
#: more than one orchestrator instance for one stack within a run.
_PROCESSES: dict[UUID, _StepProcess] = {}
_LOCK = threading.Lock()


def _terminate(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM the step's process group (it was started as its own session), then SIGKILL."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        process.wait()


@atexit.register
def _terminate_leftovers() -> None:
    """A pipeline process that exits normally (its end, an exception, Ctrl-C) takes its step
    processes with it; one killed by a signal (SIGTERM, SIGKILL) runs no atexit hook."""
    with _LOCK:
        leftovers = [entry.process for entry in _PROCESSES.values()]
    for process in leftovers:
        _terminate(process, timeout=5.0)


def _sql_store() -> SqlZenStore | None:
    """This process's ZenML store if it is in-process (not a server's client)."""
    from zenml.zen_stores.sql_zen_store import SqlZenStore

    store = Client().zen_store
    return store if isinstance(store, SqlZenStore) else None


def _fairpool_in_process() -> bool:
    """Whether this process's ZenML store is in-process with fairpool plugged in."""
    from fairpool.integrations.zenml.store import FairpoolResourcePools

    store = _sql_store()
    return store is not None and isinstance(store._resource_pools, FairpoolResourcePools)


class FairpoolStepEntrypointConfiguration(StepOperatorEntrypointConfiguration):
    """ZenML's entrypoint for one isolated step, run with this Python, with the heartbeat
    interval the orchestrator asks for and (in-process stores) fairpool plugged in."""

    @classmethod
    def get_entrypoint_command(cls) -> list[str]:
        return [sys.executable, "-m", "zenml.entrypoints.entrypoint"]

    def run(self) -> None:
        # The heartbeat stops a step with _thread.interrupt_main(), which does nothing when
        # SIGINT is ignored -- as it is in a process started in the background by a shell.
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        interval = os.environ.get(ENV_HEARTBEAT_SECONDS)
        if interval:
            from zenml.steps.heartbeat import StepHeartbeatWorker

            # ZenML reads this class constant when a step's worker is made; it has no setting.
            StepHeartbeatWorker.STEP_HEARTBEAT_INTERVAL_SECONDS = int(interval)
        _heartbeat_reads_the_status_when_it_fails()
        if os.environ.get(ENV_ENABLE) == "1":
            # The step publishes its own end (completed/failed): the release must run here.
            from fairpool.integrations.zenml.store import enable

            enable()
        try:
            super().run()
        finally:
            _publish_stopped_end(UUID(self.entrypoint_args[STEP_RUN_ID_OPTION]))


def _heartbeat_reads_the_status_when_it_fails() -> None:
    """A step's heartbeat that fails reads its step run's status instead, and stops the step
    as ZenML's heartbeat would have (a ``KeyboardInterrupt``: a checkpoint can be saved).

    ZenML 0.96's heartbeat route fails (a 500) on every server without authentication, which
    a local server (``zenml login --local``) is: it reads the run's id from the access token.
    A preempted or stopped step there ran on until ``stop_grace_seconds`` had passed, then
    was terminated (SIGTERM: no ``except``/``finally`` ran)."""
    from zenml.steps.heartbeat import StepHeartbeatWorker

    beat = StepHeartbeatWorker._heartbeat
    if getattr(beat, "reads_the_status", False):
        return

    def heartbeat(self: StepHeartbeatWorker) -> None:
        try:
            beat(self)
        except Exception as error:
            logger.debug("The heartbeat failed (%s): reading the step run's status.", error)
            status = Client().zen_store.get_run_step(self.step_id, hydrate=False).status
            if status in _STOPPED:
                self._terminated = True

    heartbeat.reads_the_status = True  # type: ignore[attr-defined]
    StepHeartbeatWorker._heartbeat = heartbeat  # type: ignore[method-assign]


def _publish_stopped_end(step_run_id: UUID) -> None:
    """A step its heartbeat stopped (preempted: CANCELLING; stopped: STOPPING) publishes its
    end itself, as the pipeline's runner would once it saw the process end. With the
    pipeline's process killed (SIGTERM, SIGKILL: no atexit) nobody did: the request stayed
    ``preempting`` and its preemptor waited for ever (helper-76). A runner still alive sees
    the process end after this, finds the step ended (or RETRYING) and goes on as ever."""
    try:
        status = Client().zen_store.get_run_step(step_run_id, hydrate=False).status
        if status == ExecutionStatus.CANCELLING:
            publish_utils.publish_cancelled_step_run(step_run_id)
        elif status == ExecutionStatus.STOPPING:
            publish_utils.publish_stopped_step_run(step_run_id)
    except Exception as error:  # the step's own outcome stays the process's
        logger.warning("Could not publish the end of step run %s: %s", step_run_id, error)


def _wait_through_stopping() -> None:
    """Makes the future of a submitted isolated step wait until the step has ended.

    ZenML's ``_IsolatedStepFuture._wait_for_step_to_finish`` stops waiting at any status
    but provisioning/running/retrying, and ``result()`` raises only for failed, cancelled or
    stopped: a step being preempted (CANCELLING) or stopped (STOPPING) made ``result()``
    return as if it had succeeded. The run then ended ``completed`` while the step still
    stopped, its process was killed at exit before anything published its end, and its
    request held its units for good (``preempting``, its preemptor waiting). Waiting on, the
    future sees what the runner's monitor publishes (CANCELLED, STOPPED) or the retry. Its
    backoff, doubling up to 64 s, suits a remote cluster's pods: here a local process, it
    held the run up to a minute after a submitted step ended (helper-86); up to 2 s now.
    Installed once per process, from the pipeline's process (the runner's)."""
    from zenml.execution.pipeline.dynamic import utils as dynamic_utils
    from zenml.execution.pipeline.dynamic.outputs import _IsolatedStepFuture

    if getattr(_IsolatedStepFuture._wait_for_step_to_finish, "waits_through_stopping", False):
        return

    def wait_through_stopping(self: _IsolatedStepFuture) -> StepRunResponse:
        delay = 0.25
        while True:
            if wrapped := self._wrapped:  # the launch's failure, or a retry's new launch
                wrapped.result()
            step_run = dynamic_utils.get_latest_step_run(
                self.pipeline_run_id, self.invocation_id, hydrate=False)
            if step_run.status not in _STILL_GOING:
                return step_run
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    wait_through_stopping.waits_through_stopping = True  # type: ignore[attr-defined]
    _IsolatedStepFuture._wait_for_step_to_finish = wait_through_stopping  # type: ignore[method-assign]


def _retry_refused_launches() -> None:
    """Makes a submitted isolated step whose launch fails with its step run ``RETRYING`` be
    launched again, as ZenML does for a called step.

    ZenML launches a submitted isolated step with ``retry=False``: retries are its monitor's,
    which only watches a step whose launch returned. A launch that fails before the step's
    process starts (its request rejected, or preempted before it started) raised, the store
    having set the step run ``RETRYING``: no new step run was ever made, the step stayed
    ``retrying`` and the run failed (helper-86). The store decides, as for any failure,
    whether retries are left; the retry config's delay and backoff apply. Installed once
    per process, from the pipeline's process (the runner's)."""
    from zenml.exceptions import RunStoppedException
    from zenml.execution.pipeline.dynamic import runner
    from zenml.execution.pipeline.dynamic import utils as dynamic_utils

    launch = runner.launch_step  # type: ignore[attr-defined]
    if getattr(launch, "retries_refused_launches", False):
        return

    def launch_step(snapshot: PipelineSnapshotResponse, step: Any, orchestrator_run_id: str,
                    retry: bool = False, remaining_retries: int | None = None,
                    wait: bool = True) -> StepRunResponse:
        if wait or retry:  # ZenML retries these itself
            return launch(snapshot=snapshot, step=step, orchestrator_run_id=orchestrator_run_id,
                          retry=retry, remaining_retries=remaining_retries, wait=wait)
        config = step.config.retry
        delay, backoff = (config.delay, config.backoff) if config else (0, 1)
        while True:
            try:
                return launch(snapshot=snapshot, step=step,
                              orchestrator_run_id=orchestrator_run_id, retry=False, wait=False)
            except RunStoppedException:
                raise
            except BaseException:
                runs = Client().list_pipeline_runs(
                    orchestrator_run_id=orchestrator_run_id, snapshot_id=snapshot.id, size=1
                ).items
                latest = dynamic_utils.get_latest_step_run(
                    runs[0].id, step.spec.invocation_id, hydrate=False) if runs else None
                if latest is None or latest.status != ExecutionStatus.RETRYING:
                    raise
                logger.info("Retrying the launch of step `%s` in %s s.", step.config.name,
                            delay)
            time.sleep(delay)
            delay *= backoff

    launch_step.retries_refused_launches = True  # type: ignore[attr-defined]
    runner.launch_step = launch_step  # type: ignore[attr-defined]


def _stop_steps(pipeline_run: PipelineRunResponse) -> None:
    """Stops a run ZenML has just set ``STOPPING``: its steps waiting for units end
    ``stopped`` (their requests ``cancelled``: their launchers stop waiting), and its running
    steps with a heartbeat are set ``STOPPING``, which their heartbeat acts on (a
    ``KeyboardInterrupt``; terminated ``stop_grace_seconds`` later if that does not stop
    them). ZenML's heartbeat would stop them on the run's ``STOPPING`` alone, but an
    in-process store's heartbeat answers the step's status only, not the run's. Steps
    without a heartbeat (inline) run to their end."""
    client = Client()
    if _sql_store() is not None and not _fairpool_in_process():
        # A waiting step's request ends with its step run (ZenML's hook), here at once.
        from fairpool.integrations.zenml.store import enable

        enable()
    for step_run in depaginate(client.list_run_steps, pipeline_run_id=pipeline_run.id):
        if step_run.status == ExecutionStatus.QUEUED:
            publish_utils.publish_stopped_step_run(step_run.id)
        elif step_run.status in _STARTED and step_run.heartbeat_threshold is not None:
            client.zen_store.update_run_step(
                step_run.id, StepRunUpdate(status=ExecutionStatus.STOPPING)
            )


class FairpoolLocalOrchestrator(LocalOrchestrator):
    """The local orchestrator, with isolated steps as subprocesses that can be stopped."""

    @property
    def config(self) -> FairpoolLocalOrchestratorConfig:
        return cast(FairpoolLocalOrchestratorConfig, self._config)

    def submit_dynamic_pipeline(
        self,
        snapshot: PipelineSnapshotResponse,
        stack: Stack,
        environment: dict[str, str],
        placeholder_run: PipelineRunResponse | None = None,
    ) -> SubmissionResult | None:
        interval = os.environ.get(
            ENV_ZENML_DYNAMIC_PIPELINE_MONITORING_INTERVAL,
            str(self.config.monitoring_interval_seconds),
        )
        _wait_through_stopping()
        _retry_refused_launches()
        if _sql_store() is not None and not _fairpool_in_process():
            # Nothing is pooled then, and nothing said so (helper-86): ZenML's store without
            # fairpool makes no requests, and every step runs at once.
            logger.warning(
                "fairpool is not enabled in this process: the steps of this run ask no "
                "resource pool for units. Call `fairpool.integrations.zenml.enable()` before "
                "running the pipeline (docs/zenml.md), or use a ZenML server with fairpool."
            )
        with temporary_environment({ENV_ZENML_DYNAMIC_PIPELINE_MONITORING_INTERVAL: interval}):
            return super().submit_dynamic_pipeline(
                snapshot=snapshot, stack=stack, environment=environment,
                placeholder_run=placeholder_run,
            )

    def submit_isolated_step(
        self, step_run_info: StepRunInfo, environment: dict[str, str]
    ) -> None:
        command, args = orchestrator_utils.get_step_entrypoint_command(
            invocation_id=step_run_info.pipeline_step_name,
            config=step_run_info.config,
            entrypoint_config_class=FairpoolStepEntrypointConfiguration,
            snapshot_id=step_run_info.snapshot.id,
            step_run_id=str(step_run_info.step_run_id),
        )
        env = {**os.environ, **environment}
        if step_run_info.snapshot.stack is not None:
            env[ENV_ZENML_ACTIVE_STACK_ID] = str(step_run_info.snapshot.stack.id)
        env[ENV_ZENML_ACTIVE_PROJECT_ID] = str(step_run_info.snapshot.project_id)
        # The step's code is imported from the pipeline's source root (the directory of the
        # script that ran the pipeline, or the ZenML repository); the step process is not
        # started from that script, so it is told.
        try:
            env.setdefault(ENV_ZENML_CUSTOM_SOURCE_ROOT, source_utils.get_source_root())
        except RuntimeError:  # no main file (a notebook without `zenml init`): ZenML's rules
            pass
        env[ENV_HEARTBEAT_SECONDS] = str(self.config.heartbeat_interval_seconds)
        env[ENV_ENABLE] = "1" if _fairpool_in_process() else "0"
        logger.info(
            "Launching isolated step `%s` in its own process.", step_run_info.pipeline_step_name
        )
        # Its own session: stop_isolated_step signals the whole process group.
        process = subprocess.Popen(command + args, env=env, start_new_session=True)
        with _LOCK:
            _PROCESSES[step_run_info.step_run_id] = _StepProcess(process)

    def get_isolated_step_status(self, step_run: StepRunResponse) -> ExecutionStatus:
        with _LOCK:
            entry = _PROCESSES.get(step_run.id)
        if entry is None:
            raise RuntimeError(f"no process of this orchestrator runs step run {step_run.id}")
        code = entry.process.poll()
        if code is None:
            self._enforce_stop(step_run.id, entry)
            return ExecutionStatus.RUNNING
        if entry.stopped:
            return ExecutionStatus.STOPPED
        if code == 0:
            return ExecutionStatus.COMPLETED
        # A step that ended because it was cancelled (preempted) or stopped says so (the
        # runner then publishes CANCELLED / STOPPED from the database's CANCELLING / STOPPING).
        if entry.ended_as is None:
            status = Client().zen_store.get_run_step(step_run.id, hydrate=False).status
            entry.ended_as = (
                ExecutionStatus.CANCELLED
                if status in (ExecutionStatus.CANCELLING, ExecutionStatus.CANCELLED)
                else ExecutionStatus.STOPPED
                if status in (ExecutionStatus.STOPPING, ExecutionStatus.STOPPED)
                else ExecutionStatus.FAILED
            )
        return entry.ended_as

    def wait_for_isolated_step(self, step_run: StepRunResponse) -> ExecutionStatus:
        """A step called without ``.submit`` is waited for here. ZenML's default polls with
        a backoff up to 16 s; a local process is cheap to poll, so its end (and with it a
        preempted step's release) is seen within half a second."""
        while True:
            status = self.get_isolated_step_status(step_run)
            if status.is_finished or status == ExecutionStatus.RETRYING:
                return status
            time.sleep(0.5)

    def _enforce_stop(self, step_run_id: UUID, entry: _StepProcess) -> None:
        """A step set to CANCELLING/STOPPING is interrupted by its heartbeat; one that has not
        stopped ``stop_grace_seconds`` later is terminated."""
        now = time.monotonic()
        if now - entry.last_check < 1.0:
            return
        entry.last_check = now
        status = Client().zen_store.get_run_step(step_run_id, hydrate=False).status
        if status not in _CANCELLING:
            entry.cancelling_since = None
            return
        if entry.cancelling_since is None:
            entry.cancelling_since = now
        if now - entry.cancelling_since >= self.config.stop_grace_seconds:
            logger.warning(
                "Step run %s is %s and still running after %.0f s: terminating its process.",
                step_run_id, status.value, self.config.stop_grace_seconds,
            )
            _terminate(entry.process)

    def _stop_run_gracefully(self, pipeline_run: PipelineRunResponse) -> None:
        _stop_steps(pipeline_run)

    def _stop_run_forcefully(self, pipeline_run: PipelineRunResponse) -> None:
        # The step processes are the pipeline's process's children, out of reach of the
        # process stopping the run (`zenml pipeline runs stop`, a server): forcefully is
        # gracefully, the orchestrator's stop_grace_seconds bounding it.
        _stop_steps(pipeline_run)

    def stop_isolated_step(self, step_run: StepRunResponse) -> None:
        with _LOCK:
            entry = _PROCESSES.get(step_run.id)
        if entry is None or entry.process.poll() is not None:
            return
        entry.stopped = True
        _terminate(entry.process)

    def cleanup_isolated_step(self, step_run: StepRunResponse) -> None:
        with _LOCK:
            entry = _PROCESSES.pop(step_run.id, None)
        if entry is not None and entry.process.poll() is None:
            _terminate(entry.process)


class FairpoolLocalOrchestratorFlavor(LocalOrchestratorFlavor):
    """``fairpool_local``: the local orchestrator with stoppable isolated resource steps."""

    @property
    def name(self) -> str:
        return FLAVOR

    @property
    def config_class(self) -> type[FairpoolLocalOrchestratorConfig]:
        return FairpoolLocalOrchestratorConfig

    @property
    def implementation_class(self) -> type[FairpoolLocalOrchestrator]:
        return FairpoolLocalOrchestrator
