"""The asyncio SDK: operations as coroutines, ``async with acquire``, preemption as a
cancellation turned into ``Preempted``, the decorator's retries; on the embedded store and
through a real server (on PostgreSQL)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fairpool import AsyncClient, ResourceSettings
from fairpool.client import NotGranted, Preempted, Rejected, WaitTimeout
from fairpool.errors import Conflict, InvalidInput
from tests.servers import ApiServer, running


# Remote through a server on PostgreSQL: the client's remote path is the same whatever the
# server's store, and the server on SQLite is tested through the sync SDK.
@pytest.fixture(params=["embedded", "postgresql"])
def target(
    request: pytest.FixtureRequest, tmp_path: Path, new_database: Callable[..., str]
) -> Iterator[dict[str, str]]:
    """``AsyncClient`` arguments: the embedded store, or a server on PostgreSQL."""
    if request.param == "embedded":
        yield {"home": str(tmp_path), "url": ""}
        return
    url = new_database(request.param, migrated=True)
    with running(ApiServer(tmp_path / "server.log", database_url=url, tick=0.5)) as (server,):
        yield {"url": server.url}
    assert "Traceback" not in server.log()


async def setup(client: AsyncClient, pool: str, gpus: int) -> None:
    """A pool with ``low`` and ``high`` components."""
    await client.create_pool(pool, {"gpu": gpus})
    await client.attach_policy(pool, f"{pool}-low", priority=1)
    await client.attach_policy(pool, f"{pool}-high", priority=9)


def run(coroutine: object) -> None:
    asyncio.run(coroutine)  # type: ignore[arg-type]


def test_acquire_holds_then_releases(target: dict[str, str]) -> None:
    async def main() -> None:
        async with AsyncClient(**target) as client:
            await setup(client, "a-hold", 2)
            settings = ResourceSettings(gpu_count=2)
            async with client.acquire(settings, component="a-hold-low") as grant:
                assert grant.pool == "a-hold"
                assert grant.resources == {"gpu": 2, "step_run": 1}
                assert (await client.get(grant.id)).status == "allocated"
            assert (await client.get(grant.id)).status == "released"
            with pytest.raises(Rejected, match="gpu requested 3 > capacity 2"):
                async with client.acquire({"gpu": 3}, component="a-hold-low"):
                    pytest.fail("never granted")
            with pytest.raises(InvalidInput, match="gpu"):
                await client.submit({"gpu": -1}, component="a-hold-low")

    run(main())


def test_a_waiting_acquire_leaves_the_loop_free_and_wakes_on_release(
    target: dict[str, str],
) -> None:
    async def main() -> None:
        async with AsyncClient(**target) as client:
            await setup(client, "a-wait", 1)
            holder = await client.submit({"gpu": 1}, component="a-wait-low")
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            ticking = asyncio.create_task(tick())
            asyncio.get_running_loop().call_later(
                0.5, lambda: asyncio.ensure_future(client.release(holder.id))
            )
            started = time.monotonic()
            async with client.acquire({"gpu": 1}, component="a-wait-low", timeout=20) as grant:
                waited = time.monotonic() - started
                assert grant.request.status == "allocated"
            ticking.cancel()
            assert 0.4 < waited < 5
            assert ticks > 20  # the loop ran other tasks while the acquire waited

    run(main())


def test_timeout_and_cancellation_cancel_the_queued_request(target: dict[str, str]) -> None:
    async def main() -> None:
        async with AsyncClient(**target) as client:
            await setup(client, "a-time", 1)
            await client.submit({"gpu": 1}, component="a-time-high", lease_ttl=None)
            with pytest.raises(WaitTimeout, match="cancelled: gave up waiting after 0.5 s "
                               r"\(it was queued: a-time #1: ") as raised:
                async with client.acquire({"gpu": 1}, component="a-time-low", timeout=0.5):
                    pytest.fail("never granted")
            assert (await client.get(raised.value.request.id)).status == "cancelled"

            async def wait_forever() -> None:
                async with client.acquire({"gpu": 1}, component="a-time-low"):
                    pytest.fail("never granted")

            waiting = asyncio.create_task(wait_forever())
            while not await client.list_requests("queued", "a-time-low"):
                await asyncio.sleep(0.02)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            ended = [(r.status, r.status_reason)
                     for r in await client.list_requests(component="a-time-low")]
            assert ended == [("cancelled", "cancelled: gave up waiting after 0.5 s"),
                             ("cancelled", "cancelled: interrupted while waiting (CancelledError)")]
            # A NaN timeout would be a deadline that never comes (the loop spun); refused
            # before anything is sent, as a bad lease is.
            with pytest.raises(InvalidInput, match="timeout: must be a finite number"):
                await client.wait(raised.value.request.id, float("nan"))
            with pytest.raises(InvalidInput, match="timeout: must be a finite number"):
                client.acquire({"gpu": 1}, component="a-time-low", timeout=float("nan"))
            with pytest.raises(InvalidInput, match="lease_ttl: must be an integer"):
                client.acquire({"gpu": 1}, component="a-time-low", lease_ttl=None)  # type: ignore[arg-type]
            assert len(await client.list_requests(component="a-time-low")) == 2

    run(main())


def test_preemption_cancels_the_holder_within_a_heartbeat(target: dict[str, str]) -> None:
    async def main() -> None:
        async with AsyncClient(**target) as client:
            await setup(client, "a-pre", 2)
            lease_ttl = 3  # a heartbeat a second
            preempted_at: list[float] = []

            async def preempt() -> None:
                await asyncio.sleep(0.3)
                await client.submit({"gpu": 2}, component="a-pre-high")
                preempted_at.append(time.monotonic())

            with pytest.raises(Preempted, match="priority 9 > 1") as raised:
                async with client.acquire(
                    {"gpu": 2}, component="a-pre-low", lease_ttl=lease_ttl
                ) as grant:
                    task = asyncio.create_task(preempt())
                    await asyncio.sleep(30)  # cancelled by the heartbeat
            await task
            heard = time.monotonic() - preempted_at[0]
            assert heard < lease_ttl / 3 + 0.5
            assert raised.value.request.id == grant.id
            assert (await client.get(grant.id)).status == "preempted"
            with pytest.raises(Conflict):  # nothing to give back: the grant did not
                await client.release(grant.id)

    run(main())


def test_one_acquire_entered_twice_in_turn_hears_of_its_preemption_each_time(
    target: dict[str, str]
) -> None:
    """Its way out left it "leaving" for good: on its second use a preemption was heard only
    as the block ended (10 s later here), not within a heartbeat. Entered while it holds, it
    is refused, as its exit would end the other's grant."""
    async def main() -> None:
        async with AsyncClient(**target) as client:
            await setup(client, "a-twice", 2)
            acquire = client.acquire({"gpu": 2}, component="a-twice-low", lease_ttl=3)
            blocker = await client.submit({"gpu": 2}, component="a-twice-high")

            async def hold() -> str:
                async with acquire as grant:
                    return grant.id

            waiting = asyncio.create_task(hold())
            while not await client.list_requests(status="queued"):
                await asyncio.sleep(0.02)
            with pytest.raises(RuntimeError, match="in use already"):
                async with acquire:
                    pytest.fail("entered while the other waits")
            await client.release(blocker.id)
            first = await waiting
            async with acquire:
                with pytest.raises(RuntimeError, match="in use already"):
                    async with acquire:
                        pytest.fail("entered twice")
            assert (await client.get(first)).status == "released"
            started = time.monotonic()
            with pytest.raises(Preempted):
                async with acquire:
                    await client.submit({"gpu": 2}, component="a-twice-high")
                    await asyncio.sleep(10)
            assert time.monotonic() - started < 3

    run(main())


def test_many_waiting_tasks_do_not_hold_up_a_holders_heartbeats(target: dict[str, str]) -> None:
    """More waits than the loop's default executor has threads (min(32, CPUs + 4)): the
    holder's heartbeats still run on time, so its preemption is heard within one."""
    async def main() -> None:
        async with AsyncClient(**target) as client:
            await setup(client, "a-many", 1)

            async def wait_in_line() -> None:
                async with client.acquire({"gpu": 1}, component="a-many-low", timeout=60):
                    pytest.fail("never granted")

            with pytest.raises(Preempted):
                async with client.acquire({"gpu": 1}, component="a-many-low", lease_ttl=3):
                    waiters = [asyncio.create_task(wait_in_line()) for _ in range(12)]
                    while len(await client.list_requests("queued", "a-many-low")) < 12:
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(0.5)  # their long-polls are in place
                    await client.submit({"gpu": 1}, component="a-many-high", lease_ttl=None)
                    preempted_at = time.monotonic()
                    await asyncio.sleep(30)  # cancelled by the heartbeat
            heard = time.monotonic() - preempted_at
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
            assert heard < 1.5, f"preemption heard after {heard:.1f} s"

    run(main())


def test_a_block_that_swallows_the_cancellation_still_hears_of_the_preemption(
    target: dict[str, str],
) -> None:
    async def main() -> None:
        async with AsyncClient(**target) as client:
            await setup(client, "a-swallow", 1)
            with pytest.raises(Preempted):
                async with client.acquire({"gpu": 1}, component="a-swallow-low", lease_ttl=1):
                    await client.submit({"gpu": 1}, component="a-swallow-high", lease_ttl=None)
                    try:
                        await asyncio.sleep(30)
                    except asyncio.CancelledError:
                        pass  # a block that tidies up and carries on
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 0  # no cancellation left pending
            await asyncio.sleep(0)  # which would be raised here

    run(main())


def test_a_cancellation_from_elsewhere_stays_a_cancellation(target: dict[str, str]) -> None:
    async def main() -> None:
        async with AsyncClient(**target) as client:
            await setup(client, "a-own", 1)
            held: list[str] = []

            async def hold() -> None:
                async with client.acquire({"gpu": 1}, component="a-own-low") as grant:
                    held.append(grant.id)
                    await asyncio.sleep(30)

            holding = asyncio.create_task(hold())
            while not held:
                await asyncio.sleep(0.02)
            holding.cancel()
            with pytest.raises(asyncio.CancelledError):
                await holding
            assert (await client.get(held[0])).status == "released"

    run(main())


@pytest.mark.parametrize("checkpoint", [False, True], ids=["as-told", "checkpoint"])
def test_the_decorator_runs_again_on_the_retry_attempt(target: dict[str, str],
                                                       checkpoint: bool) -> None:
    """Also when the function saves a checkpoint for longer than the lease before it goes:
    the retry attempt granted meanwhile expired, and it was not run again (helper-84)."""

    async def main() -> None:
        async with AsyncClient(**target) as client:
            await setup(client, "a-deco", 2)
            runs: list[str] = []

            @client.acquire({"gpu": 2}, component="a-deco-low", lease_ttl=1, max_retries=1,
                            timeout=20)
            async def train(name: str) -> str:
                runs.append(name)
                if len(runs) == 1:
                    boss = await client.submit({"gpu": 2}, component="a-deco-high")
                    asyncio.get_running_loop().call_later(
                        0.8, lambda: asyncio.ensure_future(client.release(boss.id))
                    )
                    try:
                        await asyncio.sleep(30)  # cancelled by the preemption
                    except asyncio.CancelledError:
                        if checkpoint:
                            await asyncio.sleep(3)  # the retry is granted at 0.8 s, lease 1 s
                        raise
                return f"{name} done"

            assert await train("model") == "model done"
            assert runs == ["model", "model"]
            attempts = await client.list_requests(component="a-deco-low")
            assert [(r.attempt, r.status) for r in attempts] == [(1, "preempted"), (2, "released")]

    run(main())


@pytest.mark.parametrize("raises", [True, False], ids=["raises", "returns"])
def test_a_function_that_ends_before_it_hears_of_its_preemption_leaves_no_retry(
    target: dict[str, str], raises: bool
) -> None:
    """The error went up; the retry attempt stayed queued, to be granted to nobody. One that
    returned was run again on it, its work done twice (helper-59): its result stands."""
    async def main() -> None:
        client = AsyncClient(**target)
        await setup(client, "own", 2)
        runs: list[str] = []

        @client.acquire({"gpu": 2}, component="own-low", lease_ttl=30, max_retries=1)
        async def train() -> str:
            runs.append("start")
            await client.submit({"gpu": 2}, component="own-high")
            if raises:
                raise RuntimeError("CUDA out of memory")
            return "done"

        if raises:
            with pytest.raises(RuntimeError):
                await train()
        else:
            assert await train() == "done"
        assert runs == ["start"]
        attempts = sorted((r.attempt, r.status, r.status_reason)
                          for r in await client.list_requests(component="own-low"))
        assert attempts[1] == (2, "cancelled", "cancelled: not followed: its holder ended "
                               "before it heard of the preemption")
        await client.close()

    run(main())


def test_a_holder_hears_within_a_heartbeat_that_its_request_was_deleted(
    target: dict[str, str]
) -> None:
    async def main() -> None:
        client = AsyncClient(**target)
        await setup(client, "gone", 2)
        with pytest.raises(NotGranted, match=r"was deleted: deleted while held$"):
            async with client.acquire({"gpu": 2}, component="gone-low", lease_ttl=1) as grant:
                await client.delete(grant.id)
                await asyncio.sleep(10)  # cancelled
        await client.close()

    run(main())


def test_a_wait_given_up_as_its_request_is_granted_gives_the_units_back(
    target: dict[str, str]
) -> None:
    """Granted between the wait's last answer and the check before the cancel: it was
    cancelled only if still queued, and stayed allocated to nobody until its lease ran out."""
    async def main() -> None:
        client = AsyncClient(**target)
        await setup(client, "late", 2)
        blocker = await client.submit({"gpu": 2}, component="late-high", lease_ttl=None)
        waited = client.wait

        async def wait(ref: str, timeout: float | None) -> object:
            still = await waited(ref, 0)  # queued, as the wait answers
            await client.release(blocker.id)  # and granted just after
            return still

        client.wait = wait  # type: ignore[method-assign]
        with pytest.raises(WaitTimeout):
            async with client.acquire({"gpu": 2}, component="late-low", timeout=0.1):
                pytest.fail("never held")
        (mine,) = await client.list_requests(component="late-low")
        assert mine.status == "cancelled" and mine.allocated_at is not None
        assert (await client.get_pool("late")).occupied == {"gpu": 0}
        await client.close()

    run(main())


def test_a_with_block_refuses_retries_before_submitting(target: dict[str, str]) -> None:
    """Its retry attempt got the units after the preemption, for nobody, until its lease
    ended: a with block runs once (the decorator runs again)."""
    async def main() -> None:
        async with AsyncClient(**target) as client:
            await setup(client, "a-once", 2)
            with pytest.raises(InvalidInput, match=r"^max_retries: a with block runs once"):
                async with client.acquire({"gpu": 1}, component="a-once-low", max_retries=1):
                    pass
            assert await client.list_requests(component="a-once-low") == []

    run(main())


def test_a_cancellation_during_the_submit_withdraws_the_request_it_makes(
    target: dict[str, str],
) -> None:
    """The submit runs in a thread, which a cancellation does not stop: the request it made
    stayed queued, was allocated to nobody and held its units until its lease ended."""
    async def main() -> None:
        async with AsyncClient(**target) as client:
            await setup(client, "a-sub", 1)
            await client.submit({"gpu": 1}, component="a-sub-high", lease_ttl=None)
            acquiring = asyncio.create_task(
                client.acquire({"gpu": 1}, component="a-sub-low").__aenter__())
            await asyncio.sleep(0)  # the submit is on its way
            acquiring.cancel()
            with pytest.raises(asyncio.CancelledError):
                await acquiring
            assert [(r.status, r.status_reason)
                    for r in await client.list_requests(component="a-sub-low")] == [
                ("cancelled", "cancelled: interrupted while waiting (CancelledError)")]
            with pytest.raises(TypeError, match="decorates an async def"):
                client.acquire({"gpu": 1}, component="a-sub-low")(lambda: None)  # type: ignore[arg-type]

    run(main())
