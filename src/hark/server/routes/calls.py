"""Calls: ``POST /v1/realtime/calls`` (and the beta ``POST /v1/realtime``) answers a WebRTC
SDP offer; a call that rang (SIP, Twilio) is answered with
``POST /v1/realtime/calls/{call_id}/accept`` (a session config), declined with ``/reject`` or
transferred with ``/refer``, where the call's transport allows it (``MediaCall.actions``);
``/hangup`` ends a call of any kind, and a WebSocket to ``/v1/realtime?call_id=…`` attaches
to a call's events (a sideband). Each works on any worker: what belongs to another worker
is forwarded to it.

A call that rings belongs to no key while it rings: any real API key of the server may accept or
reject it (as OpenAI lets the project that owns the trunk), and the key that accepts it owns
it from then on. A call answered without a webhook stays everyone's (any real key).

An ephemeral key opens calls, and controls no call but the one it opened: it may hang that
one up and attach its sideband; accept, reject and refer, and every other call, need the
API key.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from aiohttp import web

from hark.cluster.forwarding import CALLS_OPENED_HEADER, ForwardError, is_forwarded
from hark.cluster.node import Placement
from hark.cluster.store import ClusterUnavailableError, WorkerInfo
from hark.protocol.errors import ProtocolError
from hark.protocol.session_config import parse_session_config
from hark.server.access import KEY, api_key_only, principal, requires
from hark.server.admission import admit_session, release_session, usage_counter
from hark.server.auth import Principal, offered_subprotocols
from hark.server.bodies import decode_text, read_limited
from hark.server.errors import (
    cluster_unavailable,
    draining,
    engines_failed,
    error_response,
    forbidden,
    invalid_request,
    too_large,
    unavailable,
)
from hark.server.state import (
    CALL_REGISTRIES,
    CALLS,
    FORWARDER,
    LIMITS,
    METRICS,
    NODE,
    REALTIME_MODEL,
    STATE,
)
from hark.transports.beta import is_beta
from hark.transports.call import (
    CallOfferError,
    CallReferError,
    CallStateError,
    CallTypeError,
    MediaCall,
)
from hark.transports.webrtc.sdp import MAX_OFFER_BYTES, OfferError
from hark.transports.websocket import REALTIME_SUBPROTOCOL, websocket_response

logger = logging.getLogger(__name__)

# A session config sent along an offer is a few KB; this leaves room, not abuse.
MAX_SESSION_PART_BYTES = 256 * 1024
# A multipart offer: both parts and the multipart framing around them.
MAX_OFFER_BODY_BYTES = MAX_OFFER_BYTES + MAX_SESSION_PART_BYTES + 16 * 1024
# A multipart offer's parts: ``sdp`` and ``session``, and room for a client's extras.
MAX_OFFER_PARTS = 8
# The reject and refer bodies: one small field each.
MAX_CONTROL_BODY_BYTES = 16 * 1024
# The beta dialect's WebRTC endpoint: its calls' data channels speak the beta dialect.
BETA_CALLS_PATH = "/v1/realtime"
MAX_TARGET_URI_CHARS = 1024
# A SIP or tel URI as a Refer-To header carries it: no spaces, angle brackets, quotes or
# control characters, which would break out of the header.
# The API's call actions, as a refusal words them.
_DONE = {"accept": "accepted", "reject": "rejected", "refer": "referred"}
_TARGET_URI = re.compile(r"(?:sips?:[^\s<>\"]+|tel:\+?[0-9A-Da-d*#().\-]+(?:;[^\s<>\"]*)?)")


def routes() -> list[web.RouteDef]:
    """The call routes (the sideband is reached through the sessions route)."""
    return [
        # The beta dialect's WebRTC endpoint: an SDP offer posted to /v1/realtime.
        web.post(BETA_CALLS_PATH, create_call),
        web.post("/v1/realtime/calls", create_call),
        web.post("/v1/realtime/calls/{call_id}/accept", accept_call),
        web.post("/v1/realtime/calls/{call_id}/reject", reject_call),
        web.post("/v1/realtime/calls/{call_id}/refer", refer_call),
        web.post("/v1/realtime/calls/{call_id}/hangup", hangup_call),
    ]


@requires(KEY)
async def create_call(request: web.Request) -> web.StreamResponse:
    """Answer an offer with the SDP answer (201, the call's URL in ``Location``).

    Unless another worker sent it here, the offer goes to the least-loaded ready worker of
    the cluster (this one on a tie), and that worker answers it.
    """
    try:
        body = await read_limited(request.content.read, MAX_OFFER_BODY_BYTES)
    except ProtocolError as exc:
        return invalid_request(exc)
    if is_forwarded(request):
        # The worker that placed the call learns which of this worker's calls it became.
        response, opened_as = await _answer_call(request, body)
        if opened_as is not None:
            response.headers[CALLS_OPENED_HEADER] = str(opened_as)
        return response
    placed, here = await _place_call(request, body)
    if placed is not None:
        return placed
    opened_as = None
    try:
        response, opened_as = await _answer_call(request, body)
        return response
    finally:
        if here is not None:
            request.app[NODE].settle(here, opened_as)


async def _answer_call(request: web.Request, body: bytes) -> tuple[web.Response, int | None]:
    """Open the call here and answer its offer; with the call's ``opened_as`` when it opened."""
    caller = principal(request)
    state = request.app[STATE]
    if state.draining:
        return draining(), None
    calls = request.app[CALLS]
    if "webrtc" in state.unavailable or not calls.mux.started:
        return unavailable("WebRTC is not available on this server."), None
    try:
        offer, session = parse_offer(request.headers.get("Content-Type", ""), body)
        config = caller.ephemeral.session if caller.ephemeral is not None else None
        if session is not None:
            config = parse_session_config(session, base=config, param_prefix="session")
    except ProtocolError as exc:
        return invalid_request(exc), None
    if not await state.engines_ready():
        return engines_failed(), None
    limits = request.app[LIMITS]
    refusal = await admit_session(request.app, caller.owner)
    if refusal is not None:
        return refusal, None
    model = request.query.get("model") or (config.model if config is not None else None)
    try:
        call, answer = await calls.create(
            offer,
            owner=caller.owner,
            model=model or REALTIME_MODEL,
            config=config,
            on_usage=usage_counter(limits, caller.owner),
            # The preview's clients post their offer to /v1/realtime.
            beta=request.path == BETA_CALLS_PATH or is_beta(request.headers),
        )
    except OfferError as exc:
        await release_session(request.app, caller.owner)
        return error_response(400, str(exc), param="sdp", code="invalid_offer"), None
    except BaseException:
        await asyncio.shield(release_session(request.app, caller.owner))
        raise
    if caller.ephemeral is not None and calls.get(call.id) is not None:
        # Forgotten when the call ends (hark.server.app).
        state.opened_by_ephemeral[call.id] = caller.ephemeral.digest
    await request.app[NODE].register_call(call.id, caller.owner)
    logger.info("call %s opened for %s (model %r)", call.id, caller.owner, model)
    response = web.Response(
        status=201,
        body=answer.encode(),
        content_type="application/sdp",
        headers={"Location": f"/v1/realtime/calls/{call.id}"},
    )
    return response, call.opened_as


async def _place_call(
    request: web.Request, body: bytes
) -> tuple[web.StreamResponse | None, Placement | None]:
    """Send a new call's offer to the worker placement picks: its answer, or None when the
    call is to open here (with the placement to settle once it did).

    A worker that cannot be reached is passed over for the next one. With the store down,
    the call stays here: a call needs no shared state to run, only to be placed.
    """
    node = request.app[NODE]
    draining_here = request.app[STATE].draining
    try:
        candidates = await node.place(
            exclude=frozenset({node.id}) if draining_here else frozenset()
        )
    except ClusterUnavailableError as exc:
        logger.warning("cannot place a call (%s); answering it here", exc)
        return None, None
    forwarder = request.app[FORWARDER]
    metrics = request.app[METRICS]
    for worker in candidates:
        placement = node.placed(worker.id)
        if worker.id == node.id:
            metrics.placements.labels("here").inc()
            return None, placement
        try:
            answer = await forwarder.http(request, worker, body)
        except ForwardError as exc:
            node.settle(placement, None)
            metrics.forwarded.labels("offer", "unreachable").inc()
            logger.warning("placing a call on %s failed: %s", worker.id, exc)
            continue
        except BaseException:
            node.settle(placement, None)
            raise
        # A figure for the workers alone: the client never sees it.
        opened_as = answer.headers.popall(CALLS_OPENED_HEADER, [""])[0]
        node.settle(placement, int(opened_as) if answer.status == 201 and opened_as else None)
        metrics.placements.labels("other").inc()
        metrics.forwarded.labels("offer", "ok").inc()
        logger.info("call placed on worker %s (%s)", worker.id, worker.url)
        return answer, None
    metrics.placements.labels("here").inc()
    return None, None


def parse_offer(content_type: str, body: bytes) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer and, from a multipart form, the session object; raises ProtocolError."""
    if not content_type.lower().startswith("multipart/form-data"):
        if len(body) > MAX_OFFER_BYTES:
            raise too_large(MAX_OFFER_BYTES)
        return decode_text(body, "sdp"), None
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        raise ProtocolError("The multipart body could not be parsed.", code="invalid_body")
    sdp: str | None = None
    session: dict[str, Any] | None = None
    if len(message.get_payload()) > MAX_OFFER_PARTS:
        raise ProtocolError(
            f"The form has more than {MAX_OFFER_PARTS} parts.", code="too_many_parts"
        )
    for part in message.iter_parts():
        if not isinstance(part, Message) or part.is_multipart():
            raise ProtocolError("Nested multipart bodies are not supported.", code="invalid_body")
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        if name == "sdp":
            if len(data) > MAX_OFFER_BYTES:
                raise too_large(MAX_OFFER_BYTES)
            sdp = decode_text(data, "sdp")
        elif name == "session":
            if len(data) > MAX_SESSION_PART_BYTES:
                raise too_large(MAX_SESSION_PART_BYTES)
            try:
                value = json.loads(data)
            except ValueError:
                raise ProtocolError(
                    "The 'session' part is not valid JSON.", param="session", code="invalid_json"
                ) from None
            if not isinstance(value, dict):
                raise ProtocolError(
                    "Invalid type for 'session': expected an object.",
                    param="session",
                    code="invalid_type",
                )
            session = value
    if sdp is None:
        raise ProtocolError(
            "Missing required parameter: 'sdp'.", param="sdp", code="missing_required_parameter"
        )
    return sdp, session


@requires(KEY)
async def hangup_call(request: web.Request) -> web.Response:
    """End a call, wherever it lives (a SIP call gets its BYE)."""
    call = await _find_call(request, principal(request), request.match_info["call_id"])
    if isinstance(call, web.Response):
        return call
    if isinstance(call, WorkerInfo):
        return await _forward(request, call, "hangup")
    await call.close("hangup")
    return web.Response(status=200)


@requires(api_key_only("Ephemeral keys cannot accept calls."))
async def accept_call(request: web.Request) -> web.Response:
    """Answer a ringing call with the session config in the body (as the SDK's
    ``client.realtime.calls.accept`` sends it); the accepting key owns the call."""
    caller = principal(request)
    call = await _find_call_for(request, caller, "accept")
    if isinstance(call, web.Response):
        return call
    try:
        body = await read_limited(request.content.read, MAX_SESSION_PART_BYTES)
        config = parse_session_config(_json_object(body), param_prefix="session")
    except ProtocolError as exc:
        return invalid_request(exc)
    if config.type != "realtime":
        return error_response(
            400,
            "A call is accepted with a realtime session, not a transcription session.",
            param="type",
            code="invalid_value",
        )
    if call.state != "pending":
        return _wrong_state(call, "accepted")
    if not await request.app[STATE].engines_ready():
        return engines_failed()
    refusal = await admit_session(request.app, caller.owner)
    if refusal is not None:
        return refusal
    if call.state != "pending":
        # Another accept or the caller's CANCEL won while the limits were checked.
        await release_session(request.app, caller.owner)
        return _wrong_state(call, "accepted")
    # From here on, the call's end releases the session it counts as.
    call.admitted = True
    try:
        await call.accept(config, caller.owner)
    except CallOfferError as exc:
        return error_response(400, str(exc), param="call_id", code="invalid_offer")
    except CallStateError as exc:
        return error_response(409, str(exc), param="call_id", code="invalid_call_state")
    except OSError as exc:
        logger.error("call %s: no RTP port: %s", call.id, exc)
        return unavailable("No RTP port is free for the call.", "rtp_unavailable")
    await request.app[NODE].register_call(call.id, caller.owner)
    logger.info("call %s accepted by %s (model %r)", call.id, caller.owner, config.model)
    return web.Response(status=200)


@requires(api_key_only("Ephemeral keys cannot reject calls."))
async def reject_call(request: web.Request) -> web.Response:
    """Decline a ringing call with ``status_code`` (default 603 Decline)."""
    call = await _find_call_for(request, principal(request), "reject")
    if isinstance(call, web.Response):
        return call
    try:
        body = await read_limited(request.content.read, MAX_CONTROL_BODY_BYTES)
        data = _json_object(body) if body.strip() else {}
    except ProtocolError as exc:
        return invalid_request(exc)
    status = data.get("status_code", 603)
    if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 699:
        return error_response(
            400,
            "Invalid 'status_code': expected a SIP final status from 400 to 699.",
            param="status_code",
            code="invalid_value",
        )
    try:
        call.reject(status)
    except CallStateError:
        return _wrong_state(call, "rejected")
    logger.info("call %s rejected with %d", call.id, status)
    return web.Response(status=200)


@requires(api_key_only("Ephemeral keys cannot transfer calls."))
async def refer_call(request: web.Request) -> web.Response:
    """Transfer an answered call to ``target_uri`` (``tel:`` or ``sip:``), a SIP call with a
    REFER, a Twilio call through Twilio's REST API; answers once the transfer's outcome is
    known."""
    call = await _find_call_for(request, principal(request), "refer")
    if isinstance(call, web.Response):
        return call
    try:
        body = await read_limited(request.content.read, MAX_CONTROL_BODY_BYTES)
        data = _json_object(body)
    except ProtocolError as exc:
        return invalid_request(exc)
    target = data.get("target_uri")
    if target is None:
        return error_response(
            400,
            "Missing required parameter: 'target_uri'.",
            param="target_uri",
            code="missing_required_parameter",
        )
    if (
        not isinstance(target, str)
        or len(target) > MAX_TARGET_URI_CHARS
        or _TARGET_URI.fullmatch(target) is None
    ):
        return error_response(
            400,
            "Invalid 'target_uri': expected a tel: or sip: URI, such as tel:+14155550123 or "
            "sip:agent@example.com.",
            param="target_uri",
            code="invalid_value",
        )
    try:
        status = await call.refer(target)
    except CallStateError:
        return _wrong_state(call, "referred")
    except CallTypeError as exc:
        return error_response(400, str(exc), param="call_id", code="invalid_call_type")
    except CallReferError as exc:
        return error_response(
            502, f"The transfer failed: {exc}", type="server_error", code="refer_failed"
        )
    except TimeoutError:
        return error_response(
            504,
            "The transfer got no final answer from the caller's side.",
            type="server_error",
            code="refer_timeout",
        )
    if not 200 <= status < 300:
        return error_response(
            409,
            f"The transfer failed: the SIP peer answered {status}.",
            param="target_uri",
            code="refer_failed",
        )
    return web.Response(status=200)


async def _find_call_for(
    request: web.Request, caller: Principal, action: str
) -> MediaCall | web.Response:
    """The call of the request, here, if its transport allows ``action``; what is elsewhere
    is forwarded to its worker and the worker's answer returned."""
    call = await _find_call(request, caller, request.match_info["call_id"])
    if isinstance(call, WorkerInfo):
        return await _forward(request, call, action)
    if isinstance(call, MediaCall) and action not in call.actions:
        return error_response(
            400, call.refusal(_DONE[action]), param="call_id", code="invalid_call_type"
        )
    return call


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        raise ProtocolError("The body is not valid JSON.", code="invalid_json") from None
    if not isinstance(value, dict):
        raise ProtocolError("The body must be a JSON object.", code="invalid_type")
    return value


def _wrong_state(call: MediaCall, action: str) -> web.Response:
    state = {"pending": "ringing", "accepted": "answered"}.get(call.state, call.state)
    if call.closed.is_set() or call.close_reason is not None:
        state = "ended"
    return error_response(
        409,
        f"The call is {state}; it cannot be {action}.",
        param="call_id",
        code="invalid_call_state",
    )


async def _forward(request: web.Request, worker: WorkerInfo, kind: str) -> web.Response:
    """Pass the request to ``worker``, which owns its call; its answer, or a 503."""
    forwarded = request.app[METRICS].forwarded
    try:
        answer = await request.app[FORWARDER].http(request, worker, await request.read())
    except ForwardError as exc:
        forwarded.labels(kind, "unreachable").inc()
        logger.warning("a %s could not reach its call's worker: %s", kind, exc)
        return _owner_unreachable()
    forwarded.labels(kind, "ok").inc()
    return answer


async def attach_sideband(request: web.Request, call_id: str) -> web.StreamResponse:
    """A WebSocket to ``/v1/realtime?call_id=rtc_…``: the call's events, both ways."""
    caller = principal(request)
    call = await _find_call(request, caller, call_id)
    if isinstance(call, web.Response):
        return call
    ws = websocket_response(
        offered_realtime=REALTIME_SUBPROTOCOL in offered_subprotocols(request.headers)
    )
    if not ws.can_prepare(request).ok:
        return error_response(400, "Expected a WebSocket upgrade request.")
    if isinstance(call, MediaCall) and call.state != "accepted":
        return error_response(
            409,
            "The call has not been accepted; accept it before attaching to it.",
            param="call_id",
            code="invalid_call_state",
        )
    state = request.app[STATE]
    if isinstance(call, WorkerInfo):
        state.websockets.add(ws)
        forwarded = request.app[METRICS].forwarded
        try:
            piped = await request.app[FORWARDER].websocket(request, call, ws)
        except ForwardError as exc:
            forwarded.labels("sideband", "unreachable").inc()
            logger.warning("a sideband could not reach its call's worker: %s", exc)
            return _owner_unreachable()
        finally:
            state.websockets.discard(ws)
        forwarded.labels("sideband", "ok").inc()
        return piped
    await ws.prepare(request)
    state.websockets.add(ws)
    logger.info("sideband attached to call %s for %s", call.id, caller.owner)
    try:
        await call.attach(ws)
    finally:
        state.websockets.discard(ws)
    return ws


def _owner_unreachable() -> web.Response:
    return unavailable(
        "The server that holds this call cannot be reached; try again.", "call_unreachable"
    )


async def _find_call(
    request: web.Request, caller: Principal, call_id: str
) -> MediaCall | WorkerInfo | web.Response:
    """The live call ``call_id`` if it is here, the worker that has it if it is elsewhere,
    or the refusal: 404 for a call that does not exist (or no longer does), 403 for another
    key's call, the same on every worker."""
    not_found = error_response(
        404, f"No call found with id '{call_id[:100]}'.", param="call_id", code="not_found"
    )
    call: MediaCall | None = None
    for registry in request.app[CALL_REGISTRIES]:
        call = registry.get(call_id)
        if call is not None:
            break
    if call is not None:
        return (
            _check_owner(call.id, call.owner, caller)
            or _check_ephemeral(request, call.id, caller)
            or call
        )
    node = request.app[NODE]
    if is_forwarded(request):
        return not_found
    try:
        record = await node.find_call(call_id)
        if record is None or record.worker_id == node.id:
            return not_found
        refusal = _check_owner(record.id, record.owner, caller)
        if refusal is not None:
            return refusal
        worker = await node.worker(record.worker_id)
    except ClusterUnavailableError as exc:
        logger.warning("cannot look up call %s: %s", call_id[:100], exc)
        return cluster_unavailable()
    return not_found if worker is None else worker


def _check_ephemeral(request: web.Request, call_id: str, caller: Principal) -> web.Response | None:
    """An ephemeral key reaches only the call it opened (checked where the call lives: a
    request for a call elsewhere is forwarded there with its key)."""
    if caller.ephemeral is None:
        return None
    if request.app[STATE].opened_by_ephemeral.get(call_id) == caller.ephemeral.digest:
        return None
    logger.info("refused access to call %s for an ephemeral key of %s", call_id, caller.owner)
    return forbidden("An ephemeral key can only reach the call it opened; use an API key.")


def _check_owner(call_id: str, owner: str, caller: Principal) -> web.Response | None:
    if owner == caller.owner or (owner == "" and caller.ephemeral is None):
        # An unclaimed SIP call is any real key's (see the module's docstring).
        return None
    logger.info("refused access to call %s for %s", call_id, caller.owner)
    return forbidden("This call was created with another API key.")
