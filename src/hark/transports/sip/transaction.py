"""SIP transactions (RFC 3261 §17, with RFC 6026's Accepted state), sans-I/O.

A transaction is fed what arrives (``receive_request``/``receive_response``), what its user
sends (``send_response``), and the time (``handle_timer(now)``); it says when it next needs
the time (``get_timer``) and hands out the bytes to put on the wire (``data_to_send``).
Where those bytes go is its owner's business: the flow a request came in on, or the next
hop of a request sent.

Timers are the RFC's (T1 = 500 ms, T2 = 4 s, T4 = 5 s, 64·T1 = 32 s) unless ``Timers`` says
otherwise (a smaller T1 on a closed network, §17.1.1.1, shortens every timeout). Over a reliable
transport nothing is retransmitted and the "wait for strays" timers are zero, except that a
2xx to an INVITE is retransmitted on every transport until its ACK (§13.3.1.4): a proxy on
the way may forward it over UDP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hark.transports.sip.message import BRANCH_COOKIE, Request, Response


@dataclass(frozen=True, slots=True)
class Timers:
    """The transaction timers' base values in seconds (RFC 3261 §17.1.1.1)."""

    t1: float = 0.5
    t2: float = 4.0
    t4: float = 5.0

    @property
    def timeout(self) -> float:
        """64·T1: how long a transaction waits for its answer or its ACK."""
        return 64 * self.t1


RFC_TIMERS = Timers()

TransactionKey = tuple[str, ...]


def server_key(request: Request) -> TransactionKey:
    """The key that matches a request to its server transaction (§17.2.3).

    An ACK matches the INVITE it acknowledges (a non-2xx's ACK reuses the INVITE's branch);
    a CANCEL is a transaction of its own. Requests from RFC 2543 peers (no magic cookie)
    fall back on Call-ID, CSeq number, From tag and the top Via.
    """
    via = request.vias[0]
    method = "INVITE" if request.method == "ACK" else request.method
    branch = via.branch or ""
    sent_by = f"{via.host}:{via.port or ''}"
    if branch.startswith(BRANCH_COOKIE):
        return ("3261", branch, sent_by, method)
    cseq = request.cseq
    return (
        "2543",
        request.call_id,
        str(cseq.number),
        request.from_addr.tag or "",
        str(via),
        method,
    )


def client_key(branch: str, method: str) -> TransactionKey:
    """The key that matches a response to its client transaction (§17.1.3)."""
    return (branch, method)


class _Transaction:
    def __init__(self, *, reliable: bool, timers: Timers) -> None:
        self.reliable = reliable
        self.timers = timers
        self._outgoing: list[bytes] = []
        self._timer: float | None = None
        self.state = "trying"
        self._deadline = 0.0
        self._retransmit_at: float | None = None

    def data_to_send(self) -> list[bytes]:
        """The messages to send now, in order."""
        out, self._outgoing = self._outgoing, []
        return out

    def get_timer(self) -> float | None:
        """When ``handle_timer`` must next be called (None: not until something arrives)."""
        return self._timer

    def _rearm(self) -> None:
        """The timer is the earlier of the next retransmission and the deadline."""
        if self.state == "terminated":
            self._timer = None
            return
        self._timer = self._deadline
        if self._retransmit_at is not None:
            self._timer = min(self._timer, self._retransmit_at)


class _ServerTransaction(_Transaction):
    """What both server sides keep: the request, and the last response to send again."""

    def __init__(self, request: Request, *, reliable: bool, timers: Timers) -> None:
        super().__init__(reliable=reliable, timers=timers)
        self.request = request
        self.last_response: Response | None = None
        self._last_bytes = b""

    def _respond(self, response: Response) -> None:
        self.last_response = response
        self._last_bytes = response.encode()
        self._outgoing.append(self._last_bytes)

    def _respond_again(self) -> None:
        """A retransmitted request: the last response (if any yet) goes out again."""
        if self._last_bytes:
            self._outgoing.append(self._last_bytes)


InviteServerState = Literal["proceeding", "accepted", "completed", "confirmed", "terminated"]


class InviteServerTransaction(_ServerTransaction):
    """The server side of an INVITE (§17.2.1), with the Accepted state of RFC 6026 §7.1.

    Final responses: a non-2xx is retransmitted (timer G, UDP only) until the ACK that
    shares the INVITE's branch arrives, or timer H (32 s); a 2xx is retransmitted (T1
    doubling to T2) until ``ack_received`` (the ACK of a 2xx is a request of its own, matched
    by the dialog), or for 32 s, after which ``handle_timer`` reports the timeout.
    """

    def __init__(
        self, request: Request, *, reliable: bool, now: float, timers: Timers = RFC_TIMERS
    ) -> None:
        super().__init__(request, reliable=reliable, timers=timers)
        self.state: InviteServerState = "proceeding"
        self._interval = self.timers.t1
        self.acknowledged = False

    def send_response(self, response: Response, now: float) -> None:
        """Send a provisional or final response; later ones after a final are ignored."""
        if self.state != "proceeding":
            return
        self._respond(response)
        if response.status < 200:
            return
        self._deadline = now + self.timers.timeout
        self._interval = self.timers.t1
        if response.status < 300:
            self.state = "accepted"
            self._retransmit_at = now + self.timers.t1
        else:
            self.state = "completed"
            self._retransmit_at = None if self.reliable else now + self.timers.t1
        self._rearm()

    def receive_request(self, request: Request, now: float) -> None:
        """A retransmitted INVITE (answered again) or the ACK of a non-2xx final response."""
        if request.method == "ACK":
            if self.state == "completed":
                self.state = "confirmed"
                self._retransmit_at = None
                self._deadline = now + (0.0 if self.reliable else self.timers.t4)
                self._rearm()
            return
        if self.state in ("proceeding", "accepted", "completed"):
            self._respond_again()

    def ack_received(self, now: float) -> None:
        """The ACK of the 2xx arrived: stop retransmitting it.

        The transaction stays until its deadline (RFC 6026 §7.1) to answer INVITEs that
        still come from before the ACK with the 2xx again.
        """
        if self.state == "accepted" and not self.acknowledged:
            self.acknowledged = True
            self._retransmit_at = None
            self._rearm()

    def handle_timer(self, now: float) -> bool:
        """Retransmit or time out; True when a 2xx went unacknowledged for 32 s."""
        if self._timer is None or now < self._timer:
            return False
        if now >= self._deadline and self.state in ("accepted", "completed", "confirmed"):
            timed_out = self.state == "accepted" and not self.acknowledged
            self.state = "terminated"
            self._timer = None
            return timed_out
        if self._retransmit_at is not None and now >= self._retransmit_at:
            self._outgoing.append(self._last_bytes)
            self._interval = min(self._interval * 2, self.timers.t2)
            self._retransmit_at = now + self._interval
        self._rearm()
        return False


ServerState = Literal["trying", "proceeding", "completed", "terminated"]


class ServerTransaction(_ServerTransaction):
    """The server side of any request but INVITE and ACK (§17.2.2).

    A retransmitted request is answered with the last response sent; after the final
    response the transaction stays (timer J, 32 s over UDP) to absorb retransmissions.
    """

    def __init__(
        self, request: Request, *, reliable: bool, now: float, timers: Timers = RFC_TIMERS
    ) -> None:
        super().__init__(request, reliable=reliable, timers=timers)
        self.state: ServerState = "trying"

    def send_response(self, response: Response, now: float) -> None:
        """Send a response; anything after the final one is ignored."""
        if self.state in ("completed", "terminated"):
            return
        self._respond(response)
        if response.status < 200:
            self.state = "proceeding"
            return
        self.state = "completed"
        self._timer = now + (0.0 if self.reliable else self.timers.timeout)

    def receive_request(self, request: Request, now: float) -> None:
        """A retransmission of the request: the last response goes out again."""
        if self.state in ("proceeding", "completed"):
            self._respond_again()

    def handle_timer(self, now: float) -> bool:
        """Timer J: the transaction ends. Never a timeout the user must hear of."""
        if self._timer is not None and now >= self._timer:
            self.state = "terminated"
            self._timer = None
        return False


ClientState = Literal["trying", "proceeding", "completed", "terminated"]


class ClientTransaction(_Transaction):
    """The client side of a request other than INVITE (§17.1.2): BYE, REFER, NOTIFY …

    The request goes out at once and again on timer E (T1 doubling to T2, UDP only) until a
    response; with no final response in 32 s (timer F) ``handle_timer`` reports the timeout.
    """

    def __init__(
        self, request: Request, *, reliable: bool, now: float, timers: Timers = RFC_TIMERS
    ) -> None:
        super().__init__(reliable=reliable, timers=timers)
        self.request = request
        self.branch = request.vias[0].branch or ""
        self.key = client_key(self.branch, request.method)
        self.state: ClientState = "trying"
        self.final: Response | None = None
        self._bytes = request.encode()
        self._outgoing.append(self._bytes)
        self._deadline = now + self.timers.timeout
        self._interval = self.timers.t1
        self._retransmit_at = None if reliable else now + self.timers.t1
        self._rearm()

    def receive_response(self, response: Response, now: float) -> Response | None:
        """A response to this request: returned when its user must see it, else None."""
        if self.state in ("completed", "terminated"):
            return None
        if response.status < 200:
            self.state = "proceeding"
            return response
        self.final = response
        self.state = "completed"
        self._retransmit_at = None
        self._deadline = now + (0.0 if self.reliable else self.timers.t4)
        self._rearm()
        return response

    def handle_timer(self, now: float) -> bool:
        """Retransmit, or end; True when no final response came in time (timer F)."""
        if self._timer is None or now < self._timer:
            return False
        if now >= self._deadline:
            timed_out = self.state in ("trying", "proceeding")
            self.state = "terminated"
            self._timer = None
            return timed_out
        if self._retransmit_at is not None and now >= self._retransmit_at:
            self._outgoing.append(self._bytes)
            if self.state == "proceeding":
                self._interval = self.timers.t2
            else:
                self._interval = min(self._interval * 2, self.timers.t2)
            self._retransmit_at = now + self._interval
        self._rearm()
        return False
