"""Tools with effects beyond the workspace: send_email (through the outbox) and http_request."""

import codecs
import ipaddress
import re
import socket
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from django.conf import settings

from agentops.deadline import Deadline, send_within
from tools_app.outbox import outbox_send
from tools_app.secret_refs import references_in

from .registry import ToolContext, ToolError, ToolResult, cap_text

HTTP_BODY_CAP = 1024 * 1024
EMAIL_PATTERN = r"^[^@\s,;<>]+@[^@\s,;<>]+\.[^@\s,;<>]+$"

SEND_EMAIL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "to": {"type": "string", "maxLength": 320, "pattern": EMAIL_PATTERN},
        "subject": {"type": "string", "minLength": 1, "maxLength": 500},
        "body": {"type": "string", "maxLength": 200_000},
    },
    "required": ["to", "subject", "body"],
    "additionalProperties": False,
}


def send_email(ctx: ToolContext) -> ToolResult:
    if not ctx.idempotency_key:
        raise ToolError("invalid_arguments", "send_email needs an idempotency key: a retry must not send twice")
    outbox, created = outbox_send(idempotency_key=ctx.idempotency_key, to=ctx.arguments["to"],
                                  subject=ctx.arguments["subject"], body=ctx.arguments["body"])
    if created:
        output = f"Email to {outbox.to} ({outbox.subject!r}) {outbox.status} as outbox #{outbox.pk}."
    else:
        output = (f"Email to {outbox.to} ({outbox.subject!r}) was already {outbox.status} as outbox #{outbox.pk} "
                  "under this idempotency key; nothing was sent again.")
    return ToolResult(status="completed", output=output,
                      data={"outbox_id": outbox.pk, "status": outbox.status, "duplicate": not created})


HTTP_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "method": {"type": "string", "enum": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"], "default": "GET"},
        "url": {"type": "string", "minLength": 8, "maxLength": 2048, "pattern": "^https?://"},
        "headers": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 4096},
                    "maxProperties": 50},
        "body": {"type": "string", "maxLength": HTTP_BODY_CAP},
    },
    "required": ["url"],
    "additionalProperties": False,
}


# A URL up to its path: scheme, "//" and authority (or whatever stands there before a "/", "?", "#").
_URL_HEAD = re.compile(r"[^/?#]*(?://[^/?#]*)?")


def http_request_secret_refusal(arguments: dict[str, Any]) -> str:
    """Why the call's ``{{secret:NAME}}`` references may not stand where they do ("" if they may):
    one in the URL's scheme or host would become the host, which is checked, resolved (DNS), sent
    in the clear (SNI, Host) and quoted in errors lower-cased. The path, query and headers may."""
    url = arguments.get("url")
    if not isinstance(url, str):
        return ""
    head = _URL_HEAD.match(url)
    names = references_in(head.group(0) if head else url)
    if not names:
        return ""
    return (f"http_request may reference secrets in the URL's path or query and in headers, not in its scheme or "
            f"host ({{{{secret:{names[0]}}}}}): a host is looked up in DNS, sent in the clear and shown in errors. "
            "The call did not run.")


def _host_allowed(host: str, allowed: list[str]) -> bool:
    host = host.lower().rstrip(".")
    for pattern in allowed:
        pattern = pattern.lower().strip().rstrip(".")
        if pattern == "*" or pattern == host:
            return True
        if pattern.startswith("*.") and host.endswith(pattern[1:]):
            return True
    return False


# IPv6 ranges that reach IPv4 or site networks through a translator or a tunnel, which
# ``ipaddress`` (3.11) calls global: NAT64 (well-known and local-use prefixes) reaches any IPv4
# address a translator can, 10.0.0.0/8 included; 6to4 and Teredo tunnel to embedded IPv4
# addresses; site-local is the old private range; IPv4-compatible embeds an IPv4 address.
_BLOCKED_V6 = tuple(ipaddress.ip_network(net) for net in (
    "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "2001::/32", "fec0::/10", "::/96", "100::/64"))


def _address_is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1
        elif any(ip in net for net in _BLOCKED_V6):
            return False
    return not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved
                or ip.is_unspecified or not ip.is_global)


_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$")  # an RFC 9110 token


def _checked_headers(headers: dict[str, str]) -> dict[str, str]:
    """The model's headers, or invalid_arguments for one that cannot be sent as it reads: a name
    that is not a token, a value with CR, LF or NUL (header injection) or outside Latin-1."""
    checked = {}
    for key, value in headers.items():
        if not _HEADER_NAME.match(key):
            raise ToolError("invalid_arguments", f"header name {key[:40]!r} is not a valid token")
        if any(c in value for c in "\r\n\x00"):
            raise ToolError("invalid_arguments", f"header {key!r} contains CR, LF or NUL")
        try:
            value.encode("latin-1")
        except UnicodeEncodeError as exc:
            raise ToolError("invalid_arguments", f"header {key!r} has characters outside Latin-1") from exc
        if key.lower() != "host":
            checked[key] = value
    return checked


def _text(body: bytes, encoding: str | None) -> str:
    """The body as text in its declared charset; an unknown or odd one reads as UTF-8."""
    try:
        codec = codecs.lookup(encoding or "utf-8")
    except (LookupError, ValueError):
        codec = codecs.lookup("utf-8")
    if codec.name in ("utf-7",) or not codec._is_text_encoding:
        codec = codecs.lookup("utf-8")  # base64/zlib "charsets" are not text; UTF-7 smuggles markup
    return body.decode(codec.name, "replace")


def _resolve_checked(host: str, port: int) -> str:
    """Resolve once and return the address to connect to; refuse private targets.

    The request then goes to that address (Host header and TLS name kept), so a DNS answer that
    changes between the check and the connection (DNS rebinding) cannot redirect it inward.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ToolError("network_error", f"cannot resolve {host!r}: {exc}") from exc
    addresses = [str(info[4][0]) for info in infos]
    if not getattr(settings, "AGENTOPS_HTTP_ALLOW_PRIVATE", False):
        private = [address for address in addresses if not _address_is_public(address)]
        if private:
            raise ToolError("denied", f"{host!r} resolves to a private or loopback address ({private[0]}); "
                                      "set AGENTOPS_HTTP_ALLOW_PRIVATE to allow it")
    return addresses[0]


def http_request(ctx: ToolContext) -> ToolResult:
    if ctx.network != "host":
        raise ToolError("denied", "this tool's definition allows no network")
    url = ctx.arguments["url"]
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port if parts.port is not None else (443 if parts.scheme == "https" else 80)
    except ValueError as exc:  # a port out of range or not a number, a broken [IPv6] literal
        raise ToolError("invalid_arguments", f"not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise ToolError("invalid_arguments", f"not an http(s) URL: {url!r}")
    if parts.username or parts.password:
        raise ToolError("invalid_arguments", "credentials in the URL are not allowed")
    if port == 0:
        raise ToolError("invalid_arguments", "port 0 is not a port to connect to")
    headers = _checked_headers(dict(ctx.arguments.get("headers", {})))
    allowed = list(getattr(settings, "AGENTOPS_HTTP_ALLOWED_HOSTS", []))
    if not _host_allowed(host, allowed):
        raise ToolError("denied", f"host {host!r} is not in AGENTOPS_HTTP_ALLOWED_HOSTS")
    deadline = Deadline(float(ctx.timeout_seconds))
    address = _resolve_checked(host, port)
    literal = f"[{address}]" if ":" in address else address
    pinned = urlunsplit((parts.scheme, f"{literal}:{port}", parts.path or "/", parts.query, ""))
    headers["Host"] = host if parts.port is None else f"{host}:{parts.port}"
    # The step's key, the same on every retry: a server that honours Idempotency-Key applies a
    # request the reviewer re-ran after a crash (in_doubt → retry) once. The model may set its own.
    if ctx.idempotency_key and not any(key.lower() == "idempotency-key" for key in headers):
        headers["Idempotency-Key"] = ctx.idempotency_key
    extensions: dict[str, Any] = {"sni_hostname": host} if parts.scheme == "https" else {}
    body = ctx.arguments.get("body")
    try:
        with httpx.Client(trust_env=False, follow_redirects=False, timeout=deadline.remaining()) as client:
            request = client.build_request(ctx.arguments.get("method", "GET"), pinned, headers=headers,
                                           content=body.encode() if body is not None else None,
                                           extensions=extensions)
            response, received = send_within(client, request, deadline, cap=HTTP_BODY_CAP)
    except httpx.HTTPError as exc:
        if isinstance(exc, httpx.TimeoutException) or deadline.expired:
            raise ToolError("timeout", f"the request to {host} did not finish within {ctx.timeout_seconds} s "
                                       "(a total deadline)") from exc
        raise ToolError("network_error", f"the request to {host} failed: {exc}") from exc
    finally:
        deadline.cancel()
    truncated = len(received) > HTTP_BODY_CAP
    text = _text(bytes(received[:HTTP_BODY_CAP]), response.charset_encoding)
    output = f"HTTP {response.status_code} {response.reason_phrase}\n\n{cap_text(text)}"
    return ToolResult(status="completed", output=output,
                      data={"status_code": response.status_code, "headers": dict(response.headers),
                            "body_truncated": truncated, "url": url})
