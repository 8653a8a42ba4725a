"""A Twilio account, as hark deals with it: its auth token signs the Media Streams that reach
hark, and lets hark redirect a live call through Twilio's REST API (a transfer).

Twilio signs a stream's upgrade with ``X-Twilio-Signature``: base64(HMAC-SHA1(auth token,
the URL it requested)).

``/v1/realtime/calls/{id}/refer`` on a Twilio call updates Twilio's Call resource,
``POST {api_url}/2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json`` with the form field
``Twiml`` set to ``<Response><Dial>…</Dial></Response>``: Twilio leaves the
``<Connect><Stream>`` (the stream stops, and the hark call with it) and dials the target, a
``tel:`` URI as a ``<Number>``, a ``sip:`` one as a ``<Sip>``. The request is signed in with
HTTP basic authentication, the account SID (from the stream's ``start``) and the auth token
that signs the account's streams; the token is never logged.

The API's base URL is the operator's (``twilio_api_url``), never a client's: a client names
only the target, which goes into the TwiML escaped.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from urllib.parse import quote
from xml.sax.saxutils import escape

import aiohttp

from hark.transports.call import CallReferError

API_URL = "https://api.twilio.com"
# How long Twilio may take to answer the update before the transfer is given up.
TIMEOUT_S = 10.0
# Twilio's error bodies are a few hundred bytes; more is not read.
MAX_ERROR_BYTES = 16 * 1024
# Characters RFC 3966 allows in a number only to make it readable.
_VISUAL_SEPARATORS = str.maketrans("", "", "-.()")


def signature(auth_token: str, url: str) -> str:
    """Twilio's ``X-Twilio-Signature`` of a request without a body: base64(HMAC-SHA1(auth
    token, ``url``))."""
    digest = hmac.new(auth_token.encode(), url.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def dial_twiml(target_uri: str) -> str:
    """The TwiML that dials ``target_uri`` (``tel:`` or ``sip:``/``sips:``)."""
    if target_uri.startswith("tel:"):
        number = target_uri[4:].split(";", 1)[0].translate(_VISUAL_SEPARATORS)
        noun = f"<Number>{escape(number)}</Number>"
    else:
        noun = f"<Sip>{escape(target_uri)}</Sip>"
    return f"<Response><Dial>{noun}</Dial></Response>"


class TwilioApiError(CallReferError):
    """Twilio refused the update, or could not be reached; the message says which, in
    Twilio's words where it gave some."""


class TwilioAccount:
    """The Twilio account whose auth token is ``auth_token``, its REST API at ``api_url``."""

    def __init__(
        self, auth_token: str, api_url: str = API_URL, timeout_s: float = TIMEOUT_S
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.timeout_s = timeout_s
        self._auth_token = auth_token

    def __repr__(self) -> str:
        # Never the auth token.
        return f"TwilioAccount(api_url={self.api_url!r})"

    def signed(self, url: str, given: str) -> bool:
        """Whether ``given`` is the account's signature of ``url``."""
        expected = signature(self._auth_token, url)
        return hmac.compare_digest(given.encode(), expected.encode())

    async def redirect(self, account_sid: str, call_sid: str, twiml: str) -> None:
        """Have the live call ``call_sid`` of ``account_sid`` follow ``twiml`` from now on.
        Raises ``TwilioApiError``, and ``TimeoutError`` after ``timeout_s``."""
        url = (
            f"{self.api_url}/2010-04-01/Accounts/{quote(account_sid, safe='')}"
            f"/Calls/{quote(call_sid, safe='')}.json"
        )
        credentials = base64.b64encode(f"{account_sid}:{self._auth_token}".encode()).decode()
        headers = {"Authorization": f"Basic {credentials}"}
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            # A transfer is rare: a session of its own costs less than one kept open.
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.post(url, data={"Twiml": twiml}, headers=headers) as response,
            ):
                if response.status < 300:
                    return
                body = await response.content.read(MAX_ERROR_BYTES)
                raise TwilioApiError(_twilio_error(response.status, body))
        except aiohttp.ClientError as exc:
            raise TwilioApiError(f"Twilio's API could not be reached: {exc}") from None


def _twilio_error(status: int, body: bytes) -> str:
    """What Twilio's error body says (``{"code", "message", "more_info", "status"}``)."""
    try:
        error = json.loads(body)
    except ValueError:
        error = None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        code = error.get("code")
        return f"Twilio answered {status}: {error['message']}" + (
            f" (error {code})" if isinstance(code, int) else ""
        )
    return f"Twilio answered {status}."
