"""Launch readiness check (spec, Readiness check): ``POST /v1/launch/preflight`` answers GO or NO-GO.

Four checks, each ``pass``, ``warn`` or ``fail`` with readable details; the
verdict is GO only when no check fails.

KEYS
    The payment-provider secret key (request ``payment_secret_key``, else the
    setting ``PAYMENT_SECRET_KEY``) must be a live key in an accepted format and
    not a test or placeholder value; Django's ``SECRET_KEY`` must not be a
    placeholder either. Accepted payment key formats:

    - ``sk_live_`` followed by at least 24 letters or digits (Stripe-style secret key);
    - ``rk_live_`` followed by at least 24 letters or digits (Stripe-style restricted key).

    Rejected: empty values; test keys (``sk_test_``, ``rk_test_``, anything with
    ``_test_``); publishable keys (``pk_...``, not a secret); placeholders
    (``changeme``, ``placeholder``, ``xxxx``, ``your_key``, ``<...>``, ``example``,
    ``dummy``, a key body of one or two repeated characters); anything else.
    Key values are never echoed.
DOMAIN
    The base address (request ``base_url``, else ``PUBLIC_BASE_URL``) is https
    on a real domain (not localhost, not an IP address, not a reserved or
    single-label name), and ``{base}/.well-known/agent.json`` and
    ``{base}/llms.txt`` answer 200 (the manifest with a name and version).
ORACLE
    At least one agent directory registration address is configured
    (``AGENT_DIRECTORY_URLS``) and each is a well-formed https URL on a real
    domain. Directories are not contacted: preflight registers nothing.
ASSETS
    Content source addresses (request ``campaign_source_url`` and
    ``CONTENT_SOURCE_URLS``) are well-formed https URLs that answer 2xx; the
    crawl targets (the documents the published manifest lists under ``docs``)
    answer 2xx. No content source at all is a warning.

Who sees what. The deployment's own configuration (``SECRET_KEY``,
``PAYMENT_SECRET_KEY``, ``PUBLIC_BASE_URL``, ``AGENT_DIRECTORY_URLS``,
``CONTENT_SOURCE_URLS``) is checked and reported only to operator keys. A
wallet key gets only the checks of the values it sent: nothing falls back to
the settings, and ORACLE (configuration only) is ``skipped``, so a wallet key
learns nothing about the operator's setup. The verdict is computed over the
checks that ran.

Every network read goes through one injectable *fetcher*, a callable
``(url) -> (status, body)`` that raises on a transport failure, so tests can run
the whole check against a fake. The default :class:`HttpxFetcher` fetches https
only, follows no redirects, reads at most 512 KiB, times out quickly and refuses
hosts that resolve to non-public addresses (a preflight must not become a way
to probe the gateway's private network). It resolves a name once, checks every
address, and connects to the address it checked (TLS still verifies the name),
so a second lookup cannot point the connection elsewhere; its refusals read the
same whether a name does not resolve or resolves to a private address. Preflight
writes nothing.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import urljoin, urlsplit

import httpx
from django.conf import settings
from django.utils import timezone

Fetcher = Callable[[str], tuple[int, str]]
Status = Literal["pass", "warn", "fail", "skipped"]

MAX_URLS: Final = 20
MAX_BODY_BYTES: Final = 512 * 1024

_LIVE_KEY = re.compile(r"^(sk|rk)_live_([A-Za-z0-9]{24,})$")
_PLACEHOLDER_WORDS: Final = (
    "changeme",
    "change_me",
    "change-me",
    "placeholder",
    "your_key",
    "your-key",
    "yourkey",
    "your_secret",
    "example",
    "dummy",
    "redacted",
    "insecure",
    "replace",
    "fixme",
    "todo",
)
_RESERVED_SUFFIXES: Final = (
    "localhost",
    "local",
    "localdomain",
    "internal",
    "intranet",
    "lan",
    "home",
    "corp",
    "test",
    "example",
    "invalid",
    "onion",
)


@dataclass
class CheckResult:
    """One named check (KEYS, DOMAIN, ORACLE, ASSETS) with its details."""

    name: str
    status: Status = "pass"
    details: list[str] = field(default_factory=list)

    def fail(self, detail: str) -> None:
        self.status = "fail"
        self.details.append(detail)

    def warn(self, detail: str) -> None:
        if self.status == "pass":
            self.status = "warn"
        self.details.append(detail)

    def ok(self, detail: str) -> None:
        self.details.append(detail)

    def skip(self, detail: str) -> None:
        self.status = "skipped"
        self.details.append(detail)


@dataclass(frozen=True)
class PreflightReport:
    verdict: Literal["GO", "NO-GO"]
    base_url: str
    checked_at: Any
    checks: list[CheckResult]


class FetchRefused(Exception):
    """The default fetcher will not fetch this address."""


# -- address rules -------------------------------------------------------------------------------


def placeholder_reason(value: str) -> str | None:
    """Why ``value`` looks like a placeholder rather than a real secret, or None."""
    lowered = value.lower()
    for word in _PLACEHOLDER_WORDS:
        if word in lowered:
            return f"contains the placeholder marker '{word}'"
    if re.search(r"x{4,}|X{4,}|<|>|\.\.\.", value):
        return "contains placeholder characters (xxxx, <...>, ...)"
    body = re.sub(r"^(sk|rk|pk)_(live|test)_", "", value)
    if body and len(set(body)) <= 2:
        return "is one or two characters repeated"
    return None


def host_problem(host: str | None) -> str | None:
    """Why ``host`` is not a real public domain name, or None."""
    if not host:
        return "has no host"
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:
        return "is an IP address, not a domain"
    name = host.lower().rstrip(".")
    if "." not in name:
        return "is a single-label name (not a public domain)"
    if name.rsplit(".", 1)[-1] in _RESERVED_SUFFIXES or name.startswith("localhost."):
        return "uses a reserved or private name"
    if not re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+)+", name) or not re.search(r"[a-z]", name.rsplit(".", 1)[-1]):
        return "is not a valid domain name"
    return None


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a well-formed https URL on a real domain, or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError for a bad port
    except ValueError:
        return "is not a valid URL"
    if parts.scheme != "https":
        return "is not https"
    if parts.username or parts.password:
        return "carries credentials"
    return host_problem(parts.hostname)


# -- the fetcher ---------------------------------------------------------------------------------


class HttpxFetcher:
    """Default fetcher: https GET, no redirects, short timeouts, bounded body, public addresses only."""

    def __init__(self, *, timeout: float = 5.0, allow_private: bool = False) -> None:
        self.timeout = timeout
        self.allow_private = allow_private

    def _destination(self, url: str) -> str | None:
        """The one public address to connect to for ``url`` (None: connect by name, private allowed)."""
        parts = urlsplit(url)
        if parts.scheme != "https" and not self.allow_private:
            raise FetchRefused("only https addresses are fetched")
        if self.allow_private:
            return None
        host = parts.hostname or ""
        try:
            infos = socket.getaddrinfo(host, parts.port or 443, proto=socket.IPPROTO_TCP)
            addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
        except (OSError, ValueError):
            addresses = []
        # One answer for "does not resolve" and "resolves to a private address": the refusal
        # must not tell a caller which internal names exist.
        if not addresses or not all(address.is_global for address in addresses):
            raise FetchRefused("not fetched: the host is not reachable at a public address")
        return str(addresses[0])

    def __call__(self, url: str) -> tuple[int, str]:
        address = self._destination(url)
        parts = urlsplit(url)
        headers = {"User-Agent": f"tollgate-preflight/{settings.SERVICE_VERSION}", "Accept": "*/*"}
        extensions: dict[str, Any] = {}
        target = url
        if address is not None:
            # Connect to the address that was checked; the Host header and TLS (SNI and certificate
            # verification) still use the name.
            host = parts.hostname or ""
            literal = f"[{address}]" if ":" in address else address
            netloc = f"{literal}:{parts.port}" if parts.port else literal
            target = parts._replace(netloc=netloc).geturl()
            headers["Host"] = parts.netloc.rsplit("@", 1)[-1]
            extensions["sni_hostname"] = host
        with (
            httpx.Client(timeout=self.timeout, follow_redirects=False, trust_env=False) as client,
            client.stream("GET", target, headers=headers, extensions=extensions) as response,
        ):
            body = bytearray()
            for chunk in response.iter_bytes():
                body.extend(chunk)
                if len(body) >= MAX_BODY_BYTES:
                    break
            return response.status_code, bytes(body[:MAX_BODY_BYTES]).decode("utf-8", errors="replace")


def default_fetcher() -> Fetcher:
    """The fetcher the HTTP view uses (tests replace this function)."""
    return HttpxFetcher(timeout=settings.PREFLIGHT_FETCH_TIMEOUT)


def _fetch(fetcher: Fetcher, url: str) -> tuple[int | None, str, str | None]:
    """(status, body, error); a transport failure becomes an error text, never an exception."""
    try:
        status, body = fetcher(url)
    except Exception as exc:
        text = str(exc).strip()
        return None, "", f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__
    return status, body, None


# -- the checks ----------------------------------------------------------------------------------


def check_keys(*, payment_secret_key: str, django_secret_key: str | None) -> CheckResult:
    """KEYS: the payment key, and ``SECRET_KEY`` when given (operators only)."""
    result = CheckResult("KEYS")
    key = payment_secret_key.strip()
    if not key and django_secret_key is None:
        result.skip("payment secret key: not checked (send payment_secret_key)")
        return result
    if not key:
        result.fail("payment secret key: none given (request payment_secret_key or setting PAYMENT_SECRET_KEY)")
    elif "_test_" in key.lower():
        result.fail("payment secret key: a test-mode key; a launch needs a live key")
    elif key.lower().startswith("pk_"):
        result.fail("payment secret key: a publishable key, not a secret key")
    elif (reason := placeholder_reason(key)) is not None:
        result.fail(f"payment secret key: looks like a placeholder ({reason})")
    elif (match := _LIVE_KEY.match(key)) is None:
        result.fail(
            "payment secret key: unrecognized format; accepted: sk_live_ or rk_live_ followed by at least "
            "24 letters or digits"
        )
    else:
        kind = "secret" if match.group(1) == "sk" else "restricted"
        result.ok(f"payment secret key: live {kind} key format ({match.group(1)}_live_, {len(key)} characters)")
    if django_secret_key is None:
        return result
    if (reason := placeholder_reason(django_secret_key)) is not None:
        result.fail(f"SECRET_KEY: looks like a placeholder ({reason})")
    elif len(django_secret_key) < 50:
        result.fail("SECRET_KEY: shorter than 50 characters")
    else:
        result.ok("SECRET_KEY: set, not a placeholder")
    return result


def check_domain(*, base_url: str, fetcher: Fetcher) -> tuple[CheckResult, dict[str, Any] | None]:
    """DOMAIN, plus the fetched manifest (for the crawl targets) when it parsed."""
    result = CheckResult("DOMAIN")
    if not base_url:
        result.fail("base URL: none given (request base_url or setting PUBLIC_BASE_URL)")
        return result, None
    problem = url_problem(base_url)
    if problem is not None:
        # Not fetched: an address that is not a public https domain is never contacted.
        result.fail(f"base URL {base_url} {problem}; manifests not fetched")
        return result, None
    result.ok(f"base URL {base_url} is https on a public domain name")
    manifest: dict[str, Any] | None = None
    manifest_url = f"{base_url}/.well-known/agent.json"
    status, body, error = _fetch(fetcher, manifest_url)
    if error is not None or status != 200:
        result.fail(f"GET {manifest_url}: {error or f'HTTP {status}'}")
    else:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict) or not parsed.get("name") or not parsed.get("version"):
            result.fail(f"GET {manifest_url}: 200 but not an agent manifest (JSON with name and version)")
        else:
            manifest = parsed
            result.ok(f"GET {manifest_url}: 200, {parsed['name']} {parsed['version']}")
            if parsed["version"] != settings.SERVICE_VERSION:
                result.warn(
                    f"the published manifest says version {parsed['version']}; this server is "
                    f"{settings.SERVICE_VERSION}"
                )
    llms_url = f"{base_url}/llms.txt"
    status, body, error = _fetch(fetcher, llms_url)
    if error is not None or status != 200:
        result.fail(f"GET {llms_url}: {error or f'HTTP {status}'}")
    elif not body.strip():
        result.fail(f"GET {llms_url}: 200 but empty")
    else:
        result.ok(f"GET {llms_url}: 200")
    return result, manifest


def check_oracle(*, directory_urls: Sequence[str]) -> CheckResult:
    result = CheckResult("ORACLE")
    urls = [u.strip() for u in directory_urls if u.strip()]
    if not urls:
        result.fail("no agent directory registration address configured (setting AGENT_DIRECTORY_URLS)")
        return result
    for url in urls[:MAX_URLS]:
        problem = url_problem(url)
        if problem is None:
            result.ok(f"directory {url}: well-formed https address")
        else:
            result.fail(f"directory {url} {problem}")
    if len(urls) > MAX_URLS:
        result.warn(f"only the first {MAX_URLS} of {len(urls)} directory addresses were checked")
    return result


def _crawl_targets(base_url: str, manifest: dict[str, Any] | None) -> list[str]:
    docs = manifest.get("docs") if manifest else None
    if not isinstance(docs, dict):
        return []
    targets = []
    for value in docs.values():
        if isinstance(value, str) and value.startswith("/") and not value.startswith("//"):
            url = urljoin(base_url + "/", value.lstrip("/"))
            if url not in targets:
                targets.append(url)
    return targets


def check_assets(
    *, base_url: str, manifest: dict[str, Any] | None, content_urls: Sequence[str], fetcher: Fetcher
) -> CheckResult:
    result = CheckResult("ASSETS")
    sources = list(dict.fromkeys(u.strip() for u in content_urls if u.strip()))
    if not sources:
        result.warn("no content source address given (campaign_source_url, or the operator's content sources)")

    def reachable(kind: str, url: str) -> None:
        problem = url_problem(url)
        if problem is not None:
            result.fail(f"{kind} {url} {problem}")
            return
        status, _, error = _fetch(fetcher, url)
        if error is not None:
            result.fail(f"{kind} {url}: unreachable ({error})")
        elif status is not None and 200 <= status < 300:
            result.ok(f"{kind} {url}: HTTP {status}")
        else:
            result.fail(f"{kind} {url}: HTTP {status}")

    for url in sources[:MAX_URLS]:
        reachable("content source", url)
    if manifest is None:
        result.warn("crawl targets not checked: the published manifest is not available (see DOMAIN)")
    else:
        targets = _crawl_targets(base_url, manifest)
        if not targets:
            result.warn("the published manifest lists no documents to crawl")
        for url in targets[:MAX_URLS]:
            reachable("crawl target", url)
    if len(sources) > MAX_URLS:
        result.warn(f"only the first {MAX_URLS} of {len(sources)} content sources were checked")
    return result


def launch_preflight_run(
    *,
    base_url: str,
    payment_secret_key: str,
    campaign_source_url: str,
    fetcher: Fetcher,
    directory_urls: Sequence[str] | None = None,
    content_source_urls: Sequence[str] | None = None,
    include_configuration: bool = True,
) -> PreflightReport:
    """Run KEYS, DOMAIN, ORACLE and ASSETS. Writes nothing; every network read goes through ``fetcher``.

    With ``include_configuration`` (operator keys), empty arguments fall back to the
    settings (``PAYMENT_SECRET_KEY``, ``PUBLIC_BASE_URL``, ``AGENT_DIRECTORY_URLS``,
    ``CONTENT_SOURCE_URLS``) and ``SECRET_KEY`` is checked. Without it (wallet keys),
    only the values sent are checked and configuration-only checks are ``skipped``.
    """
    if include_configuration:
        base = (base_url.strip() or settings.PUBLIC_BASE_URL).rstrip("/")
        keys = check_keys(
            payment_secret_key=payment_secret_key or settings.PAYMENT_SECRET_KEY,
            django_secret_key=settings.SECRET_KEY,
        )
        oracle = check_oracle(
            directory_urls=settings.AGENT_DIRECTORY_URLS if directory_urls is None else directory_urls,
        )
        configured_sources = settings.CONTENT_SOURCE_URLS if content_source_urls is None else content_source_urls
    else:
        base = base_url.strip().rstrip("/")
        keys = check_keys(payment_secret_key=payment_secret_key, django_secret_key=None)
        oracle = CheckResult("ORACLE")
        oracle.skip("not checked: directory registrations are the operator's configuration")
        configured_sources = list(content_source_urls or [])
    if base:
        domain, manifest = check_domain(base_url=base, fetcher=fetcher)
    else:
        domain, manifest = CheckResult("DOMAIN"), None
        domain.skip("not checked (send base_url)")
    content = [campaign_source_url, *configured_sources]
    if include_configuration or base or campaign_source_url.strip():
        assets = check_assets(base_url=base, manifest=manifest, content_urls=content, fetcher=fetcher)
    else:
        assets = CheckResult("ASSETS")
        assets.skip("not checked (send campaign_source_url or base_url)")
    checks = [keys, domain, oracle, assets]
    verdict: Literal["GO", "NO-GO"] = "NO-GO" if any(c.status == "fail" for c in checks) else "GO"
    return PreflightReport(verdict=verdict, base_url=base, checked_at=timezone.now(), checks=checks)
