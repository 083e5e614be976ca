"""``Outage``: what a wait rides out when its server, or the database it works on directly,
cannot be reached for a while (a restart, an upgrade, a failover).

The request waits on in the database meanwhile, so for up to ``WAIT_OUTAGE`` seconds a wait
answers what was last heard of it (queued) and the caller waits on; past that, or for a
request never heard of, ``Unreachable`` names the request left queued and how to cancel it.
"""

from __future__ import annotations

import logging
import time

from fairpool.errors import Unreachable
from fairpool.views import RequestView

#: How long a wait rides out its server or database out of reach: a queued request waits on
#: in the database meanwhile.
WAIT_OUTAGE = 120.0

#: The most queued requests remembered for that.
_HEARD = 1000

log = logging.getLogger(__name__)


class Outage:
    def __init__(self, what: str) -> None:
        #: What cannot be reached, for the warnings: "server", "database".
        self.what = what
        #: The queued requests by id, as last heard of (created, got, waited for).
        self._heard: dict[str, RequestView] = {}
        #: Since when nothing answers (``time.monotonic``), or None.
        self._since: float | None = None

    def hear(self, request: RequestView) -> RequestView:
        """``request`` as just answered; an answer ends the outage, if there was one."""
        if self._since is not None:
            log.info("The fairpool %s answers again", self.what)
            self._since = None
        if request.status != "queued":
            self._heard.pop(request.id, None)
            return request
        self._heard[request.id] = request
        if len(self._heard) > _HEARD:  # the oldest, most likely decided since unheard of
            self._heard.pop(next(iter(self._heard)), None)
        return request

    def unheard(self, ref: str, error: Unreachable) -> RequestView:
        """What a wait for ``ref`` answers while ``error`` keeps it from asking: the request
        as last heard of, until the outage has lasted ``WAIT_OUTAGE``; then, or if it was
        never heard of, ``Unreachable``."""
        now = time.monotonic()
        since = now if self._since is None else self._since
        # A copy: the waits of other threads (AsyncClient's) may change it meanwhile.
        heard = list(self._heard.items())
        last = next((r for id_, r in heard if id_.startswith(ref.lower())), None)
        if last is None or now - since >= WAIT_OUTAGE:
            self._since = None
            raise Unreachable(
                f"{error}; resource request `{ref}` may still be queued there (once it "
                f"answers: fairpool resource-request cancel {ref})"
            ) from None
        if self._since is None:
            self._since = now
            log.warning("%s; still waiting, for up to %d s", error, WAIT_OUTAGE)
        return last
