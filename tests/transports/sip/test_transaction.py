"""SIP transactions on the sample clock: retransmission schedules, ACK absorption, timeouts."""

from __future__ import annotations

from typing import TypeAlias

from hark.transports.sip.message import Request, build_response, parse_message
from hark.transports.sip.transaction import (
    RFC_TIMERS,
    ClientTransaction,
    InviteServerTransaction,
    ServerTransaction,
    Timers,
    server_key,
)
from tests.transports.sip.captured import BARESIP_BYE, BARESIP_INVITE

Tx: TypeAlias = InviteServerTransaction | ServerTransaction | ClientTransaction
T1, T2, T4, TIMEOUT = RFC_TIMERS.t1, RFC_TIMERS.t2, RFC_TIMERS.t4, RFC_TIMERS.timeout


def _request(data: bytes) -> Request:
    message = parse_message(data)
    assert isinstance(message, Request)
    return message


def _ack_for_non_2xx(invite: Request) -> Request:
    """The ACK of a non-2xx answer: the INVITE's branch and CSeq number (§17.1.1.3)."""
    ack = Request(method="ACK", uri=invite.uri)
    for name in ("Via", "From", "To", "Call-ID"):
        ack.add(name, invite.get(name) or "")
    ack.add("CSeq", f"{invite.cseq.number} ACK")
    return ack


def _run(tx: Tx, until: float) -> tuple[list[float], list[tuple[float, bool]]]:
    """Fire the transaction's timers up to ``until``: when it sent, and what each firing said."""
    sent: list[float] = []
    fired: list[tuple[float, bool]] = []
    while (when := tx.get_timer()) is not None and when <= until:
        timed_out = tx.handle_timer(when)
        fired.append((when, timed_out))
        sent.extend(when for _ in tx.data_to_send())
    return sent, fired


def _doubling(start: float, end: float) -> list[float]:
    """Retransmission times: T1 after ``start``, the gap doubling up to T2, before ``end``."""
    times: list[float] = []
    t, gap = start + T1, T1
    while t < end:
        times.append(t)
        gap = min(gap * 2, T2)
        t += gap
    return times


def test_a_2xx_is_retransmitted_until_its_ack() -> None:
    invite = _request(BARESIP_INVITE)
    tx = InviteServerTransaction(invite, reliable=False, now=0.0)
    tx.send_response(build_response(invite, 100), 0.0)
    tx.send_response(build_response(invite, 200, to_tag="t"), 0.1)
    first = tx.data_to_send()
    assert [m.split(b" ", 2)[1] for m in first] == [b"100", b"200"]
    sent, fired = _run(tx, 10.0)
    assert sent == [0.1 + t for t in _doubling(0.0, 9.9)]
    tx.ack_received(10.0)
    sent, fired = _run(tx, 100.0)
    assert sent == []
    assert fired == [(0.1 + TIMEOUT, False)]
    assert tx.state == "terminated"


def test_a_2xx_never_acknowledged_times_out_once_after_32_s() -> None:
    invite = _request(BARESIP_INVITE)
    for reliable in (False, True):
        tx = InviteServerTransaction(invite, reliable=reliable, now=0.0)
        tx.send_response(build_response(invite, 200, to_tag="t"), 0.0)
        tx.data_to_send()
        sent, fired = _run(tx, 100.0)
        # On every transport: a proxy on the way may carry the 2xx over UDP.
        assert sent == _doubling(0.0, TIMEOUT)
        assert [t for t, timed_out in fired if timed_out] == [TIMEOUT]
        assert tx.state == "terminated"


def test_a_smaller_t1_shortens_the_retransmissions_and_the_timeout() -> None:
    invite = _request(BARESIP_INVITE)
    timers = Timers(t1=0.02)
    tx = InviteServerTransaction(invite, reliable=False, now=0.0, timers=timers)
    tx.send_response(build_response(invite, 200, to_tag="t"), 0.0)
    tx.data_to_send()
    sent, fired = _run(tx, 100.0)
    assert sent[:3] == [0.02, 0.06, 0.14]
    assert [t for t, timed_out in fired if timed_out] == [64 * 0.02]


def test_retransmitted_invites_get_the_last_response_again() -> None:
    invite = _request(BARESIP_INVITE)
    tx = InviteServerTransaction(invite, reliable=False, now=0.0)
    tx.receive_request(invite, 0.2)
    assert tx.data_to_send() == []
    ringing = build_response(invite, 180, to_tag="t")
    tx.send_response(ringing, 0.3)
    tx.receive_request(invite, 0.5)
    assert tx.data_to_send() == [ringing.encode(), ringing.encode()]
    ok = build_response(invite, 200, to_tag="t")
    tx.send_response(ok, 1.0)
    tx.receive_request(invite, 1.1)
    assert tx.data_to_send() == [ok.encode(), ok.encode()]
    tx.send_response(build_response(invite, 486, to_tag="t"), 1.2)
    assert tx.data_to_send() == []


def test_a_non_2xx_is_retransmitted_until_the_ack_absorbed_by_the_transaction() -> None:
    invite = _request(BARESIP_INVITE)
    ack = _ack_for_non_2xx(invite)
    assert server_key(ack) == server_key(invite)
    tx = InviteServerTransaction(invite, reliable=False, now=0.0)
    busy = build_response(invite, 486, to_tag="t")
    tx.send_response(busy, 0.0)
    assert tx.data_to_send() == [busy.encode()]
    sent, _ = _run(tx, 4.0)
    assert sent == _doubling(0.0, 4.0)
    tx.receive_request(ack, 4.2)
    assert tx.state == "confirmed"
    tx.receive_request(invite, 4.3)
    assert tx.data_to_send() == []
    sent, fired = _run(tx, 100.0)
    assert sent == []
    assert fired == [(4.2 + T4, False)]
    assert tx.state == "terminated"


def test_a_non_2xx_without_ack_ends_at_timer_h_without_a_timeout() -> None:
    invite = _request(BARESIP_INVITE)
    tx = InviteServerTransaction(invite, reliable=True, now=0.0)
    tx.send_response(build_response(invite, 603, to_tag="t"), 0.0)
    tx.data_to_send()
    sent, fired = _run(tx, 100.0)
    assert sent == []
    assert fired == [(TIMEOUT, False)]
    assert tx.state == "terminated"


def test_a_non_invite_server_transaction_absorbs_retransmissions_for_timer_j() -> None:
    bye = _request(BARESIP_BYE)
    tx = ServerTransaction(bye, reliable=False, now=0.0)
    ok = build_response(bye, 200)
    tx.send_response(ok, 0.0)
    tx.receive_request(bye, 0.5)
    tx.receive_request(bye, 31.0)
    assert tx.data_to_send() == [ok.encode()] * 3
    assert _run(tx, 100.0) == ([], [(TIMEOUT, False)])
    assert tx.state == "terminated"
    tcp = ServerTransaction(bye, reliable=True, now=0.0)
    tcp.send_response(ok, 0.0)
    assert _run(tcp, 100.0)[1] == [(0.0, False)]


def test_a_client_transaction_retransmits_then_times_out() -> None:
    bye = _request(BARESIP_BYE)
    tx = ClientTransaction(bye, reliable=False, now=0.0)
    assert tx.data_to_send() == [bye.encode()]
    sent, fired = _run(tx, 100.0)
    assert sent == _doubling(0.0, TIMEOUT)
    assert [t for t, timed_out in fired if timed_out] == [TIMEOUT]
    tcp = ClientTransaction(bye, reliable=True, now=0.0)
    tcp.data_to_send()
    sent, fired = _run(tcp, 100.0)
    assert sent == [] and fired == [(TIMEOUT, True)]


def test_a_client_transaction_slows_on_a_provisional_and_stops_on_the_final() -> None:
    bye = _request(BARESIP_BYE)
    tx = ClientTransaction(bye, reliable=False, now=0.0)
    tx.data_to_send()
    trying = build_response(bye, 100)
    assert tx.receive_response(trying, 0.2) is trying
    sent, _ = _run(tx, 13.0)
    # Retransmission continues from its schedule, then every T2 (§17.1.2.2).
    assert sent == [0.5, 4.5, 8.5, 12.5]
    ok = build_response(bye, 200)
    assert tx.receive_response(ok, 13.0) is ok
    assert tx.final is ok
    assert tx.receive_response(ok, 13.1) is None
    sent, fired = _run(tx, 100.0)
    assert sent == [] and fired == [(13.0 + T4, False)]
    assert tx.state == "terminated"


def test_keys_follow_the_branch_and_fall_back_for_rfc_2543_peers() -> None:
    invite = _request(BARESIP_INVITE)
    cancel = _ack_for_non_2xx(invite)
    cancel.method = "CANCEL"
    cancel.set("CSeq", f"{invite.cseq.number} CANCEL")
    assert server_key(cancel) != server_key(invite)
    assert server_key(cancel)[:-1] == server_key(invite)[:-1]
    old = _request(BARESIP_INVITE.replace(b"branch=z9hG4bKc45c7461c808ec7b", b"branch=1"))
    old_ack = _ack_for_non_2xx(old)
    assert server_key(old)[0] == "2543"
    assert server_key(old_ack) == server_key(old)
    other = _request(BARESIP_INVITE.replace(b"CSeq: 16583", b"CSeq: 16584"))
    assert server_key(other) == server_key(invite)
