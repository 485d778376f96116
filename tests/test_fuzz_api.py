"""Schemathesis against the live gateway's /openapi.json: no 5xx, no schema violation, auth enforced.

A real gunicorn (``tests.live.running_gateway``) serves the test database, with
the SDK demo server as its upstream. A tenant (sponsor and agent wallets, keys,
credits, a permit, a quote) and an operator key are provisioned first, so
authenticated operations are exercised. Every operation of the schema is fuzzed
with positive and negative data under every applicable schemathesis check
(``CHECK_NAMES``); then the schemathesis state machine runs over the links
schemathesis infers (the document declares no OpenAPI ``links``). The run is
bounded: ``EXAMPLES_PER_MODE`` examples per operation and generation mode, a
wall-clock budget after which each remaining operation gets one example per
mode, and a few short stateful scenarios.

The fuzzing runs once per module (``fuzz_run``); the tests read its findings:

* ``test_schemathesis_reports_no_failure`` is the requirement (zero failures).
  It is an expected failure while the product defects in ``KNOWN_DEFECTS``
  remain; each defect also has a deterministic regression test below.
* ``test_schemathesis_finds_nothing_new`` fails on any finding that is not one
  of those known defects, so new regressions are caught today.

Generation settings and exclusions, each justified:

* ``allow-x00: false``: strings carry no NUL byte. PostgreSQL text cannot hold
  one and the framework answers 422 for it everywhere, which JSON Schema cannot
  express. ``test_nul_bytes_are_refused_not_crashed`` sends NUL bytes to every
  operation's string inputs instead and requires a 4xx.
* ``JUSTIFIED``: cross-field rules JSON Schema cannot state (named precisely).
* ``GET /openapi.json`` is not fuzzed: schemathesis loads the schema from it and leaves it out of the
  operations (it is fetched and parsed as the document under test).
* No other operation is excluded: the MCP transports (``POST /mcp``, ``/mcp/messages``,
  ``/mcp/public``) have no JSON body schema, so schemathesis sends arbitrary
  JSON to them; they must still answer without 5xx and with documented statuses.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import schemathesis
from django.core.management import call_command
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis.stateful import run_state_machine_as_test
from rest_framework.test import APIClient
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Ok

from common.ids import new_id
from tests import factories
from tests.conftest import client_for, make_tenant
from tests.gateway_helpers import register_upstream
from tests.live import running_gateway
from tests.upstream_server import running_demo_upstream

EXAMPLES_PER_MODE = 8
BUDGET_SECONDS = 120.0  # stateless phase; past it, each remaining operation runs one example per mode
STATEFUL_EXAMPLES = 8
STATEFUL_STEPS = 10

load_all_checks()
# Every built-in check (the stateful ones act on linked calls; object_level_authorization needs a
# second identity and is covered by tests/test_attack_authz.py).
CHECK_NAMES = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "positive_data_acceptance",
    "missing_required_header",
    "unsupported_method",
    "allow_header_conformance",
    "use_after_free",
    "ensure_resource_availability",
    "ignored_auth",
]
ALL_CHECKS = [CHECKS.get_one(name) for name in CHECK_NAMES]
CONFIG = schemathesis.Config.from_dict({"generation": {"allow-x00": False}})

# Operations that need an operator key (everything else runs with the sponsor's wallet key).
OPERATOR_OPERATIONS = {
    "POST /v1/billing/wallets/sponsor",
    "POST /v1/receipts/reconciliation/refunds/{receipt_id}/retry",
}


@dataclass(frozen=True)
class Finding:
    operation: str
    kind: str  # the schemathesis failure class, e.g. ServerError, RejectedPositiveData
    title: str
    report: str  # schemathesis' report: the failure, the response and a curl reproduction

    @property
    def key(self) -> tuple[str, str, str]:
        return self.operation, self.kind, self.title


Matcher = Callable[[Finding], bool]

# Product defects the fuzzing reports; each has a deterministic xfail(strict=True) regression test below.
KNOWN_DEFECTS: dict[str, Matcher] = {
    "D1 offset beyond bigint: 500 on every paginated list": lambda f: (
        f.kind in ("ServerError", "UndefinedStatusCode") and "[500]" in f.report and "offset=" in f.report
    ),
    "D2 public tool catalogs declare auth they do not require": lambda f: (
        f.kind == "IgnoredAuth"
        and f.operation in ("GET /mcp/tools", "GET /mcp/tools.json", "GET /.well-known/mcp/tools.json")
    ),
    "D3 required strings without minLength (blank answers 422)": lambda f: (
        f.kind == "RejectedPositiveData" and '"type":"blank"' in f.report
    ),
    "D4 Idempotency-Key header schema has no length or character rule": lambda f: (
        f.kind == "RejectedPositiveData" and '["header","Idempotency-Key"]' in f.report
    ),
    "D5 decimal fields: pattern accepts '', '-', '.' and negatives the server refuses": lambda f: (
        f.kind == "RejectedPositiveData"
        and ("A valid number is required" in f.report or '"type":"min_value"' in f.report)
    ),
    "D6 charge units: exclusiveMinimum -1e12 instead of 0": lambda f: (
        f.kind == "RejectedPositiveData" and '["query","units"]' in f.report
    ),
    "D7 verify bodies: one of two alternatives required, schema requires nothing": lambda f: (
        f.kind == "RejectedPositiveData" and ("Give permit_id" in f.report or "Give receipt_id" in f.report)
    ),
    "D8 long query strings: gunicorn 414 HTML (request line limit below the schema's maxLength)": lambda f: (
        "414" in f.report and "URI Too Long" in f.report
    ),
    "D9 MCP transports: 202 and 400 answers undocumented": lambda f: (
        f.operation in ("POST /mcp", "POST /mcp/messages", "POST /mcp/public")
        and f.kind in ("UndefinedStatusCode", "RejectedPositiveData")
        and ("Received: 202" in f.report or "Received: 400" in f.report or "[400] Bad Request" in f.report)
    ),
    "D10 string fields accept JSON numbers (coerced to strings)": lambda f: (
        f.kind == "AcceptedNegativeData" and "(was string, became" in f.report
    ),
    "D11 JSON-RPC: an invalid id (array, object) is echoed back": lambda f: (
        f.operation in ("POST /mcp", "POST /mcp/messages", "POST /mcp/public")
        and f.kind in ("JsonSchemaError", "AcceptedNegativeData")
        and "/properties/id" in f.report
    ),
}

# Refusals that are correct and that JSON Schema cannot express; only the named rule is tolerated.
JUSTIFIED: dict[str, Matcher] = {
    "verify-chain: to_seq below from_seq is 422 (a cross-field rule)": lambda f: (
        f.operation == "POST /v1/audit/verify-chain"
        and f.kind == "RejectedPositiveData"
        and "to_seq must not be below from_seq" in f.report
    ),
    "charge: service is an alias of service_category and must not differ (equality of two fields)": lambda f: (
        f.operation == "POST /v1/billing/charge"
        and f.kind == "RejectedPositiveData"
        and "service is an alias of service_category; they differ." in f.report
    ),
    "free-form documents: numbers outside ±(2**53-1) or non-finite, or nesting past 64, are 422 (common/jsonbody.py;"
    " JSON Schema cannot bound every number inside a free-form object)": lambda f: (
        f.kind == "RejectedPositiveData"
        and ('"type":"number_out_of_range"' in f.report or '"type":"json_too_deep"' in f.report)
    ),
    "agent wallet: refill_threshold and refill_amount together (dependentRequired, not generated)": lambda f: (
        f.operation == "POST /v1/billing/wallets/agent"
        and f.kind == "RejectedPositiveData"
        and "Set both refill_threshold and refill_amount, or neither." in f.report
    ),
}


def classify(finding: Finding, table: dict[str, Matcher]) -> str | None:
    for name, matches in table.items():
        if matches(finding):
            return name
    return None


@dataclass
class FuzzRun:
    operations: list[str] = field(default_factory=list)
    examples: int = 0
    stateful_steps: int = 0
    findings: dict[tuple[str, str, str], Finding] = field(default_factory=dict)
    elapsed: float = 0.0
    stateful_error: str | None = None
    inferred_links: int = 0
    documented: set[str] = field(default_factory=set)  # every operation of the served document

    def record(self, operation: str, exc: FailureGroup) -> None:
        for failure in exc.exceptions:
            finding = Finding(operation, type(failure).__name__, str(failure.title), str(exc)[:2500])
            self.findings.setdefault(finding.key, finding)

    def unjustified(self) -> list[Finding]:
        return [f for f in self.findings.values() if classify(f, JUSTIFIED) is None]


@dataclass
class Provisioned:
    sponsor_secret: str
    agent_secret: str
    operator_secret: str


def provision(upstream_url: str) -> Provisioned:
    register_upstream(upstream_url, price="1")
    tenant = make_tenant("fuzz")
    factories.top_up(tenant.agent, 500)
    r = tenant.sponsor_client.post(
        "/v1/permits",
        {"wallet_id": tenant.agent.wallet_id, "allowed_tools": ["*"], "max_credits": "100"},
        format="json",
        HTTP_IDEMPOTENCY_KEY=new_id("pk"),
    )
    assert r.status_code == 201, r.content
    return Provisioned(
        sponsor_secret=tenant.sponsor_secret,
        agent_secret=tenant.agent_secret,
        operator_secret=factories.make_operator_key().secret,
    )


def _label(operation: Any) -> str:
    return f"{operation.method.upper()} {operation.path}"


def fuzz_operation(operation: Any, keys: Provisioned, run: FuzzRun, examples: int) -> None:
    label = _label(operation)
    secret = keys.operator_secret if label in OPERATOR_OPERATIONS else keys.sponsor_secret
    headers = {"X-API-Key": secret}
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def one(case: Any) -> None:
            run.examples += 1
            try:
                case.call_and_validate(headers=headers, checks=ALL_CHECKS, timeout=30)
            except FailureGroup as exc:
                run.record(label, exc)

        try:
            one()
        except Unsatisfiable:
            # Negative mode on an operation with no input to break (no parameters, no body schema).
            assert mode == GenerationMode.NEGATIVE, label


def run_stateful(schema: Any, keys: Provisioned, run: FuzzRun) -> None:
    headers = {"X-API-Key": keys.sponsor_secret}
    machine = schema.as_state_machine()
    run.inferred_links = sum(
        len(response.get("links", {}))
        for item in schema.raw_schema["paths"].values()
        for op in item.values()
        if isinstance(op, dict)
        for response in op.get("responses", {}).values()
        if isinstance(response, dict)
    )

    class Stateful(machine):  # type: ignore[misc, valid-type]
        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"headers": headers, "timeout": 30}

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            run.stateful_steps += 1
            try:
                case.validate_response(
                    response,
                    checks=ALL_CHECKS,
                    headers=headers,
                    transport_kwargs=kwargs or None,
                    recorder=self.recorder,
                )
            except FailureGroup as exc:
                run.record(f"stateful {_label(case.operation)}", exc)

    run_state_machine_as_test(
        Stateful,
        settings=settings(
            max_examples=STATEFUL_EXAMPLES,
            stateful_step_count=STATEFUL_STEPS,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        ),
    )


@pytest.fixture(scope="module")
def fuzz_run(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FuzzRun]:
    """Provision, start the gateway, fuzz every operation, then run the state machine. Once per module."""
    run = FuzzRun()
    with django_db_blocker.unblock():
        try:
            with running_demo_upstream() as upstream:
                keys = provision(upstream.url)
                with running_gateway(
                    tmp_path_factory.mktemp("fuzz"),
                    threads=4,
                    RATE_LIMIT_REQUESTS="1000000",
                    UPSTREAM_MCP_URL=upstream.url,
                ) as gateway:
                    started = time.monotonic()
                    schema = schemathesis.openapi.from_url(f"{gateway.url}/openapi.json", config=CONFIG)
                    run.documented = {
                        f"{method.upper()} {path}"
                        for path, item in schema.raw_schema["paths"].items()
                        for method in item
                        if method in ("get", "post", "put", "patch", "delete")
                    }
                    for result in schema.get_all_operations():
                        assert isinstance(result, Ok), result  # the document parses: every operation is usable
                        operation = result.ok()
                        over_budget = time.monotonic() - started > BUDGET_SECONDS
                        fuzz_operation(operation, keys, run, 1 if over_budget else EXAMPLES_PER_MODE)
                        run.operations.append(_label(operation))
                    try:
                        run_stateful(schema, keys, run)
                    except Exception as exc:
                        run.stateful_error = f"{type(exc).__name__}: {exc}"[:3000]
                    run.elapsed = time.monotonic() - started
            print(
                f"\nschemathesis: {len(run.operations)} operations, {run.examples} examples, "
                f"{run.stateful_steps} stateful steps over {run.inferred_links} inferred links, "
                f"{len(run.findings)} distinct findings in {run.elapsed:.0f} s"
            )
            yield run
        finally:
            # What a transactional test does afterwards: leave an empty database to the next test.
            call_command("flush", interactive=False, verbosity=0)


def _format(findings: list[Finding]) -> str:
    return "\n\n".join(f"### {f.operation} -- {f.kind}: {f.title}\n{f.report}" for f in findings)


# --- The fuzzing outcome -------------------------------------------------------------------


# The tests reading ``fuzz_run`` take no database fixture: pytest-django runs database tests first, and
# splitting this module's tests across that order would run the module fixture twice.


def test_every_operation_was_fuzzed(fuzz_run):
    schema_ops = fuzz_run.documented
    # schemathesis.openapi.from_url leaves out the operation that serves the schema it loaded (GET /openapi.json):
    # that document is fetched and parsed as the schema itself.
    assert set(fuzz_run.operations) == schema_ops - {"GET /openapi.json"}
    assert fuzz_run.examples > 5 * len(schema_ops)


def test_stateful_run_completed(fuzz_run):
    """The state machine ran (over the links schemathesis infers; the document declares none)."""
    assert fuzz_run.stateful_error is None, fuzz_run.stateful_error
    assert fuzz_run.inferred_links > 0, "no links: the stateful phase could only call operations in isolation"
    assert fuzz_run.stateful_steps > 0


def test_schemathesis_finds_nothing_new(fuzz_run):
    """Every finding is one of the known product defects (listed in KNOWN_DEFECTS) or a justified rule."""
    new = [f for f in fuzz_run.unjustified() if classify(f, KNOWN_DEFECTS) is None]
    assert not new, f"{len(new)} new findings:\n\n{_format(new)}"


def test_schemathesis_reports_no_failure(fuzz_run):
    """The requirement: zero server errors and zero schema violations under every check."""
    found = sorted(fuzz_run.unjustified(), key=lambda f: f.key)
    summary = "\n".join(f"  {f.operation} -- {f.kind} [{classify(f, KNOWN_DEFECTS)}]" for f in found)
    assert not found, f"{len(found)} findings:\n{summary}\n\n{_format(found)}"


# --- Deterministic regression tests, one per defect ------------------------------------------

_schema_cache: dict[str, Any] = {}


def openapi() -> dict[str, Any]:
    if "schema" not in _schema_cache:
        _schema_cache["schema"] = APIClient().get("/openapi.json").json()
    return dict(_schema_cache["schema"])


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = openapi()["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in openapi()["paths"].items():
        for method, op in item.items():
            if method in ("get", "post", "put", "patch", "delete"):
                yield method, path, op


@pytest.fixture
def tenant_keys(settings: Any) -> dict[str, str]:
    settings.RATE_LIMIT_REQUESTS = 100_000
    tenant = make_tenant("regress")
    return {"sponsor": tenant.sponsor_secret, "wallet_id": tenant.sponsor.wallet_id}


def _fill_path(path: str, value: str = "x") -> str:
    return re.sub(r"\{[^}]+\}", value, path)


@pytest.mark.django_db(transaction=True)  # each request commits: one failure must not abort the next
def test_huge_offset_is_a_validation_error_not_a_500(tenant_keys):
    client = client_for(tenant_keys["sponsor"])
    failures = []
    for method, path, op in _operations():
        if method != "get" or not any(p["name"] == "offset" for p in op.get("parameters", [])):
            continue
        url = _fill_path(path, "pmt_x") + "?offset=100000000000000000000"
        r = client.get(url)
        if r.status_code >= 500:  # 422, an empty page (GET /mcp/tools does that) or 403/404 for the path are fine
            failures.append(f"GET {url}: {r.status_code} {r.content[:120]!r}")
    assert not failures, "\n".join(failures)


# Hostile bodies every operation that takes one must answer with a 4xx (adversarial review item 10).
HOSTILE_BODIES = {
    "nested 100,000 deep": "[" * 100_000 + "]" * 100_000,
    "nested 65 deep": '{"a": ' + "[" * 65 + "]" * 65 + "}",
    "NaN": '{"a": NaN}',
    "1e400": '{"a": 1e400}',
    "2**53+1": '{"a": 9007199254740993}',
    "-Infinity in arguments": '{"arguments": {"x": -Infinity}, "permit_id": "pmt_x", "idempotency_key": "k"}',
    "2 MiB": '{"a": "' + "x" * (2 * 1024 * 1024) + '"}',
}


@pytest.mark.django_db(transaction=True)  # each request commits: one failure must not abort the next
def test_hostile_bodies_are_4xx_on_every_operation(tenant_keys):
    client = client_for(tenant_keys["sponsor"])
    failures = []
    count = 0
    for method, path, _op in _operations():
        if method not in ("post", "put", "patch") and path not in ("/mcp", "/mcp/public", "/mcp/messages"):
            continue
        url = _fill_path(path, "pmt_x")
        for label, body in HOSTILE_BODIES.items():
            count += 1
            r = client.generic(method.upper(), url, body, content_type="application/json")
            if not 400 <= r.status_code < 500:
                failures.append(f"{method.upper()} {url} [{label}]: {r.status_code} {r.content[:120]!r}")
    assert count > 100
    assert not failures, "\n".join(failures)


@pytest.mark.django_db
def test_public_catalogs_declare_optional_auth():
    anon = APIClient()
    for path in ("/mcp/tools", "/mcp/tools.json", "/.well-known/mcp/tools.json"):
        assert anon.get(path).status_code == 200
        security = openapi()["paths"][path]["get"].get("security")
        assert security is None or {} in security, (path, security)


def _blank_rejections(client: APIClient, wallet_id: str) -> list[str]:
    """Required string inputs the server refuses as blank while the schema allows "" (no minLength)."""
    problems = []
    for method, path, op in _operations():
        if method != "post" or "{" in path:
            continue
        media = op.get("requestBody", {}).get("content", {}).get("application/json")
        if not media or not media.get("schema"):
            continue
        body_schema = _resolve(media["schema"])
        for name in body_schema.get("required", []):
            prop = _resolve(body_schema["properties"][name])
            if prop.get("type") != "string" or prop.get("minLength", 0) >= 1:
                continue
            body = {n: "" for n in body_schema.get("required", [])}
            r = client.generic(
                "POST", path, json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY=new_id("k")
            )
            if (
                r.status_code == 422
                and f'"loc":["body","{name}"],"msg":"This field may not be blank.' in r.content.decode()
            ):
                problems.append(f"POST {path} body.{name}: schema allows '' (no minLength), server answers 422 blank")
    return problems


@pytest.mark.django_db
def test_required_strings_document_min_length(tenant_keys):
    problems = _blank_rejections(client_for(tenant_keys["sponsor"]), tenant_keys["wallet_id"])
    assert not problems, "\n".join(problems)


@pytest.mark.django_db
def test_idempotency_key_header_documents_its_rule():
    for method, path, op in _operations():
        for p in op.get("parameters", []):
            if p["in"] == "header" and p["name"] == "Idempotency-Key":
                s = p["schema"]
                assert s.get("minLength") == 1, (method, path, s)
                assert s.get("maxLength") == 255, (method, path, s)


@pytest.mark.django_db
def test_decimal_pattern_requires_a_digit():
    patterns = {
        prop["pattern"]
        for schema in openapi()["components"]["schemas"].values()
        for prop in schema.get("properties", {}).values()
        if prop.get("format") == "decimal" and "pattern" in prop
    }
    assert patterns
    for pattern in patterns:
        for bad in ("", "-", ".", "-."):
            assert re.fullmatch(pattern, bad) is None, (pattern, bad)


@pytest.mark.django_db
def test_charge_units_document_greater_than_zero():
    units = next(p for p in openapi()["paths"]["/v1/billing/charge"]["post"]["parameters"] if p["name"] == "units")
    assert units["schema"].get("exclusiveMinimum") == 0, units


@pytest.mark.django_db
def test_verify_bodies_document_their_alternatives(tenant_keys):
    client = client_for(tenant_keys["sponsor"])
    for path, name in (("/v1/permits/verify", "PermitVerifyRequest"), ("/v1/receipts/verify", "ReceiptVerifyRequest")):
        assert client.post(path, {}, format="json").status_code == 422
        component = openapi()["components"]["schemas"][name]
        assert component.get("required") or component.get("anyOf") or component.get("oneOf"), name


@pytest.mark.django_db
def test_mcp_transports_document_their_statuses():
    paths = openapi()["paths"]
    for path in ("/mcp", "/mcp/messages", "/mcp/public"):
        responses = paths[path]["post"]["responses"]
        assert {"202", "400"} <= set(responses), (path, sorted(responses))


def _string_inputs(op: dict[str, Any]) -> tuple[list[tuple[str, str]], list[str]]:
    """(in, name) of string query/header/path parameters, and top-level string body fields."""
    params = [
        (p["in"], p["name"])
        for p in op.get("parameters", [])
        if p["in"] in ("query", "path", "header") and _resolve(p.get("schema", {})).get("type") == "string"
    ]
    media = op.get("requestBody", {}).get("content", {}).get("application/json")
    body_fields: list[str] = []
    if media and media.get("schema"):
        body = _resolve(media["schema"])
        body_fields = [n for n, s in body.get("properties", {}).items() if _resolve(s).get("type") == "string"]
    return params, body_fields


@pytest.mark.django_db(transaction=True)
def test_nul_bytes_are_refused_not_crashed(tmp_path):
    """What ``allow-x00: false`` leaves out of the fuzzing: a NUL byte in any string input is a 4xx, never a 5xx."""
    tenant = make_tenant("nul")
    key = tenant.sponsor_secret
    failures = []
    tried = 0
    with (
        running_gateway(tmp_path, threads=4, RATE_LIMIT_REQUESTS="1000000") as gateway,
        httpx.Client(base_url=gateway.url, timeout=30) as http,
    ):
        for method, path, op in _operations():
            params, body_fields = _string_inputs(op)
            for where, name in [*params, *(("body", n) for n in body_fields)]:
                tried += 1
                url = path
                query: dict[str, str] = {}
                headers = {"X-API-Key": key, "Idempotency-Key": new_id("k")}
                body: dict[str, Any] | None = {} if body_fields else None
                if where == "path":
                    url = path.replace("{" + name + "}", "a%00b")
                elif where == "query":
                    query[name] = "a\x00b"
                elif where == "header":
                    continue  # a NUL byte cannot travel in an HTTP header
                elif body is not None:
                    body[name] = "a\x00b"
                r = http.request(
                    method.upper(),
                    _fill_path(url, "x"),
                    params=query,
                    headers=headers,
                    content=json.dumps(body) if body is not None else None,
                )
                if r.status_code >= 500:
                    failures.append(f"{method.upper()} {path} {where}.{name}: {r.status_code} {r.text[:150]}")
    assert tried > 50
    assert not failures, "\n".join(failures)


@pytest.mark.django_db(transaction=True)
def test_charge_with_maximal_valid_query_is_not_414(tmp_path):
    tenant = make_tenant("long")
    factories.top_up(tenant.agent, 10)
    params = {
        "wallet_id": tenant.agent.wallet_id,
        "units": "1",
        "description": "é" * 500,
        "request_path": "/ü" * 150,
    }
    with running_gateway(tmp_path, RATE_LIMIT_REQUESTS="1000000") as gateway:
        r = httpx.post(
            f"{gateway.url}/v1/billing/charge", params=params, headers={"X-API-Key": tenant.agent_secret}, timeout=30
        )
    assert r.status_code == 200, (r.status_code, r.text[:200])
    assert r.headers["content-type"].startswith("application/json")


@pytest.mark.django_db
def test_string_fields_refuse_numbers(tenant_keys):
    client = client_for(tenant_keys["sponsor"])
    r = client.post("/v1/launch/preflight", {"base_url": 5}, format="json")
    assert r.status_code == 422, r.content
    r = client.post("/v1/quotes", {"wallet_id": 5, "tool": "x"}, format="json")
    assert r.status_code == 422, r.content


@pytest.mark.django_db
def test_jsonrpc_invalid_id_is_an_invalid_request(tenant_keys):
    client = client_for(tenant_keys["sponsor"])
    for path, method in (("/mcp/messages", "tools/list"), ("/mcp/public", "tools/list"), ("/mcp", "initialize")):
        body = {"jsonrpc": "2.0", "id": [1], "method": method}
        r = client.post(path, json.dumps(body), content_type="application/json")
        answer = r.json()
        assert answer["id"] is None, (path, answer)
        assert answer["error"]["code"] == -32600, (path, answer)
