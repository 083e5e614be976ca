"""A server without API tokens, and the web pages its user has open.

Without tokens, being able to send a request is all it takes to change pools and requests, and
a page on any site can make the user's browser send one to ``127.0.0.1``. Two checks, run
before anything else reads the request (``SameOrigin``):

* ``Origin``: a browser names the page's origin on every cross-site POST (the only kind that
  writes without a JSON body: a body-less rollback, release or cancel). One that is not the
  server's own (the ``Host`` it was sent to) is refused: a page may only call the server that
  served it, which is what ``/docs`` does.
* ``Host``, on a loopback-bound server: after DNS rebinding a page's own name points at
  ``127.0.0.1``, so its requests are same-origin, but they are addressed to that name. Only
  loopback names and addresses are answered; a name that would serve others needs tokens.

With tokens on, neither applies: a browser never attaches a bearer token by itself.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from fairpool.api.auth import is_loopback
from fairpool.api.errors import error_response

#: A ``Host`` header: an address in brackets or a name, then a port if any.
_HOST = re.compile(r"\[(?P<address>[^\[\]]*)\](?::[0-9]*)?|(?P<name>[^\[\]:]*)(?::[0-9]*)?")


def _names_this_machine(host: str) -> bool:
    """Whether a request's ``Host`` is a loopback name or address, with any port. The browser
    has resolved the name already: ``localhost.``, fully qualified, is ``localhost``."""
    found = _HOST.fullmatch(host)
    if found is None:
        return False
    if found["address"] is not None:
        try:
            return ipaddress.ip_address(found["address"]).is_loopback
        except ValueError:
            return False
    return is_loopback(found["name"].removesuffix("."))


def refusal(host: str | None, origin: str | None, loopback_only: bool) -> tuple[str, str] | None:
    """The header and the reason a request with these headers is refused, or None."""
    if loopback_only and host is not None and not _names_this_machine(host):
        return "Host", (
            f"refused: this server has no API tokens and answers only requests addressed to "
            f"a loopback name (127.0.0.1, ::1, localhost), not {host!r}; serve others with "
            "tokens (fairpool server --auth)"
        )
    if origin is not None and (origin == "null" or urlsplit(origin).netloc.lower()
                               != (host or "").lower()):
        return "Origin", (
            f"refused: a request from the web page of another site ({origin!r}) to a "
            "server without API tokens"
        )
    return None


class SameOrigin:
    """The checks of this module, in front of ``app`` (``create_app``, when tokens are off)."""

    def __init__(self, app: ASGIApp, *, loopback_only: bool) -> None:
        self.app = app
        self.loopback_only = loopback_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        host = origin = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        refused = refusal(host, origin, self.loopback_only)
        if refused is None:
            await self.app(scope, receive, send)
            return
        field, reason = refused
        await error_response(403, reason, field)(scope, receive, send)
