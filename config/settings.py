"""Tollgate settings. Everything comes from the environment (12-factor).

See docs/architecture.md, "Configuration", for the flags. With ``DATABASE_URL`` unset, the
embedded PostgreSQL server under ``.data/postgres`` is used: the settings find it running
(``postmaster.pid``) or point at where it would listen, and never start it. ``devtools`` starts it:
``manage.py``, the root ``conftest.py``, ``make run`` and ``make test`` (docs/decisions.md, Foundation).
"""

from __future__ import annotations

import sys
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
SERVICE_VERSION = "1.3.0"

env = environ.Env()

DJANGO_ENV = env.str("DJANGO_ENV", default="development")
PRODUCTION = DJANGO_ENV == "production"
# pytest may import these settings before any conftest runs, so its presence counts too.
TESTING = env.bool("TOLLGATE_TESTING", default=False) or "pytest" in sys.modules

_DEFAULT_SECRET = "dev-insecure-tollgate-secret-key-change-me-0123456789"
SECRET_KEY = env.str("SECRET_KEY", default=_DEFAULT_SECRET)
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver", "[::1]"])
PUBLIC_BASE_URL = env.str("PUBLIC_BASE_URL", default="http://127.0.0.1:8000")

# Feature flags (docs/architecture.md, "Configuration").
ENABLE_DOGFOOD_TOOL = env.bool("ENABLE_DOGFOOD_TOOL", default=False)
ENABLE_PROOF_SURFACES = env.bool("ENABLE_PROOF_SURFACES", default=False)
ENABLE_MCP_STREAMABLE_HTTP = env.bool("ENABLE_MCP_STREAMABLE_HTTP", default=not PRODUCTION)
ALLOWED_ORIGINS = env.list(
    "ALLOWED_ORIGINS",
    default=[] if PRODUCTION else ["http://127.0.0.1:8000", "http://localhost:8000"],
)
UPSTREAM_MCP_URL = env.str("UPSTREAM_MCP_URL", default="")
UPSTREAM_CONNECT_TIMEOUT = env.float("UPSTREAM_CONNECT_TIMEOUT", default=2.0)
UPSTREAM_READ_TIMEOUT = env.float("UPSTREAM_READ_TIMEOUT", default=15.0)
# A claimed dispatch older than connect + 2 x read timeout + this margin is swept to delivery_uncertain.
SWEEP_MARGIN_SECONDS = env.float("SWEEP_MARGIN_SECONDS", default=30.0)
# An MCP handshake session lives this long after initialize (then 404: the client initializes again);
# sweep_dispatches deletes ended and expired sessions.
MCP_SESSION_TTL_SECONDS = env.float("MCP_SESSION_TTL_SECONDS", default=86400.0)
# Live MCP sessions per API key: an initialize beyond it ends the key's oldest (the client of an ended
# session gets 404 and initializes again, the MCP rule).
MCP_SESSIONS_PER_KEY = env.int("MCP_SESSIONS_PER_KEY", default=100)
if MCP_SESSIONS_PER_KEY < 1:
    raise ImproperlyConfigured("MCP_SESSIONS_PER_KEY must be at least 1.")
# A proposal relaxing a policy's human approval waits this long for a second person's confirmation
# (docs/decisions.md, "Operator console"); then it expires and cannot be confirmed.
POLICY_PROPOSAL_TTL_HOURS = env.float("POLICY_PROPOSAL_TTL_HOURS", default=72.0)
if not 0 < POLICY_PROPOSAL_TTL_HOURS <= 24 * 365:
    raise ImproperlyConfigured("POLICY_PROPOSAL_TTL_HOURS must be above 0 and at most a year.")
# Active API keys per wallet: a key beyond it is refused (409 api_key_limit_reached); a rotation that
# revokes the old key still works at the cap (docs/decisions.md, "Caps on keys and pending requests").
API_KEYS_PER_WALLET = env.int("API_KEYS_PER_WALLET", default=20)
if API_KEYS_PER_WALLET < 1:
    raise ImproperlyConfigured("API_KEYS_PER_WALLET must be at least 1.")
# Pending permit requests (each one emails the approvers) per wallet line: an agent wallet with its
# child wallets, or a sponsor wallet; one beyond it is refused (409 permit_request_limit_reached).
PERMIT_REQUESTS_PENDING_PER_WALLET = env.int("PERMIT_REQUESTS_PENDING_PER_WALLET", default=10)
if PERMIT_REQUESTS_PENDING_PER_WALLET < 1:
    raise ImproperlyConfigured("PERMIT_REQUESTS_PENDING_PER_WALLET must be at least 1.")

# Bounds on a tool call's arguments, checked before they are validated against the tool's inputSchema
# (mcpgateway.argschema): values in all, items per array or entries per object, and the steps the
# validation may take. Past any of them the call is refused (422) before anything is accepted or charged.
TOOL_ARGUMENT_MAX_NODES = env.int("TOOL_ARGUMENT_MAX_NODES", default=50_000)
TOOL_ARGUMENT_MAX_ITEMS = env.int("TOOL_ARGUMENT_MAX_ITEMS", default=10_000)
TOOL_ARGUMENT_MAX_STEPS = env.int("TOOL_ARGUMENT_MAX_STEPS", default=50_000)
for _name in ("TOOL_ARGUMENT_MAX_NODES", "TOOL_ARGUMENT_MAX_ITEMS", "TOOL_ARGUMENT_MAX_STEPS"):
    if globals()[_name] < 1:
        raise ImproperlyConfigured(f"{_name} must be at least 1.")

# Rate limits (spec, Limits). Adjustable only so that benchmarks can measure
# throughput; the defaults are the contract.
RATE_LIMIT_REQUESTS = env.int("RATE_LIMIT_REQUESTS", default=120)
RATE_LIMIT_WINDOW_SECONDS = env.int("RATE_LIMIT_WINDOW_SECONDS", default=60)
RATE_LIMIT_REJECTED_MULTIPLIER = 10

# Failed sign-ins on the console and the approval pages (access.login_throttle; docs/decisions.md,
# Operator console): failures per sliding hour of one account from one client, of one account from
# every client, and of one client for every account; each lockout lasts the next cool-off of the list,
# and the count of lockouts starts again after LOGIN_LOCKOUT_RESET_HOURS without a failure or a lock.
LOGIN_FAILURES_PER_CLIENT = env.int("LOGIN_FAILURES_PER_CLIENT", default=12)
LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR = env.int("LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR", default=100)
LOGIN_FAILURES_PER_ADDRESS_PER_HOUR = env.int("LOGIN_FAILURES_PER_ADDRESS_PER_HOUR", default=100)
LOGIN_COOLOFF_MINUTES = [int(m) for m in env.list("LOGIN_COOLOFF_MINUTES", default=["1", "5", "15", "60"])]
LOGIN_LOCKOUT_RESET_HOURS = env.float("LOGIN_LOCKOUT_RESET_HOURS", default=24.0)
if min(LOGIN_FAILURES_PER_CLIENT, LOGIN_FAILURES_PER_ACCOUNT_PER_HOUR, LOGIN_FAILURES_PER_ADDRESS_PER_HOUR) < 1:
    raise ImproperlyConfigured("LOGIN_FAILURES_PER_* must be at least 1.")
if not LOGIN_COOLOFF_MINUTES or min(LOGIN_COOLOFF_MINUTES) < 1 or LOGIN_LOCKOUT_RESET_HOURS <= 0:
    raise ImproperlyConfigured(
        "LOGIN_COOLOFF_MINUTES must list whole minutes (at least 1); LOGIN_LOCKOUT_RESET_HOURS > 0."
    )

# Evidence signing key: a base64url Ed25519 private key (32 bytes) in the
# environment, or a file outside the repository. `make run` generates the file.
SIGNING_KEY_PRIVATE = env.str("SIGNING_KEY_PRIVATE", default="")
SIGNING_KEY_FILE = env.str("SIGNING_KEY_FILE", default=str(BASE_DIR / ".data" / "keys" / "signing-keys.json"))
# The transparency log (docs/audit-chain.md, "The transparency log"). Each tenant's log is named
# <TLOG_GATEWAY_NAME>/tlog/<tenant id> (default: the host and port of PUBLIC_BASE_URL); its checkpoints are
# signed by the log note key (TLOG_KEY_PRIVATE, a base64url Ed25519 seed, or the file, created mode 0600
# by the integrator). The integrator signs a checkpoint every TLOG_CHECKPOINT_INTERVAL seconds while
# there are new leaves, and asks each of TLOG_WITNESSES (JSON: [{"name", "key", "url"}]) to cosign it.
TLOG_GATEWAY_NAME = env.str("TLOG_GATEWAY_NAME", default="") or PUBLIC_BASE_URL.split("://", 1)[-1].split("/", 1)[0]
TLOG_KEY_PRIVATE = env.str("TLOG_KEY_PRIVATE", default="")
TLOG_KEY_FILE = env.str("TLOG_KEY_FILE", default=str(BASE_DIR / ".data" / "keys" / "tlog-key.json"))
TLOG_CHECKPOINT_INTERVAL = env.float("TLOG_CHECKPOINT_INTERVAL", default=2.0)
TLOG_WITNESSES = env.json("TLOG_WITNESSES", default=[])
TLOG_WITNESS_TIMEOUT = env.float("TLOG_WITNESS_TIMEOUT", default=5.0)
# A witness that fails to answer is skipped for TLOG_CHECKPOINT_INTERVAL doubled per consecutive failure,
# at most TLOG_WITNESS_BACKOFF_MAX seconds (docs/audit-chain.md).
TLOG_WITNESS_BACKOFF_MAX = env.float("TLOG_WITNESS_BACKOFF_MAX", default=300.0)
if not 0 < TLOG_WITNESS_BACKOFF_MAX <= 86400:
    raise ImproperlyConfigured("TLOG_WITNESS_BACKOFF_MAX is a number of seconds above 0 and at most 86400.")
if not 0 < TLOG_CHECKPOINT_INTERVAL <= 60:
    raise ImproperlyConfigured("TLOG_CHECKPOINT_INTERVAL is a number of seconds above 0 and at most 60.")
if not isinstance(TLOG_WITNESSES, list) or not all(
    isinstance(w, dict) and all(isinstance(w.get(k), str) and w.get(k) for k in ("name", "key", "url"))
    for w in TLOG_WITNESSES
):
    raise ImproperlyConfigured('TLOG_WITNESSES is a JSON list of {"name", "key", "url"} objects.')
if len({w["name"] for w in TLOG_WITNESSES}) != len(TLOG_WITNESSES):
    # Each witness's standing is kept by name (tlog.models.WitnessState): two entries of one name would share it.
    raise ImproperlyConfigured("TLOG_WITNESSES names each witness once.")
# Upstream servers' credentials are stored encrypted (mcpgateway.upstream.secrets): a Fernet key in the
# environment, or a file created mode 0600 on first use.
UPSTREAM_SECRETS_KEY = env.str("UPSTREAM_SECRETS_KEY", default="")
# Keys that still decrypt upstream credentials but never encrypt: the old key while rotating
# (manage.py rotate_upstream_secrets; docs/decisions.md, "Upstream servers").
UPSTREAM_SECRETS_PREVIOUS_KEYS = env.list("UPSTREAM_SECRETS_PREVIOUS_KEYS", default=[])
UPSTREAM_SECRETS_KEY_FILE = env.str(
    "UPSTREAM_SECRETS_KEY_FILE", default=str(BASE_DIR / ".data" / "keys" / "upstream-secrets.key")
)
# An upstream's OAuth access token is fetched again once it is within this many seconds of its expiry.
UPSTREAM_OAUTH_EXPIRY_MARGIN = env.float("UPSTREAM_OAUTH_EXPIRY_MARGIN", default=30.0)

if PRODUCTION:
    problems = []
    if DEBUG:
        problems.append("DEBUG is on")
    if SECRET_KEY == _DEFAULT_SECRET or len(SECRET_KEY) < 32:
        problems.append("SECRET_KEY is the default or too short")
    if ENABLE_DOGFOOD_TOOL:
        problems.append("ENABLE_DOGFOOD_TOOL is on")
    if not ALLOWED_ORIGINS:
        problems.append("ALLOWED_ORIGINS is empty")
    if env.str("TOLLGATE_FAULTS", default=""):
        problems.append("TOLLGATE_FAULTS (test-only fault injection) is set")
    if problems:
        raise ImproperlyConfigured("refusing to start in production: " + "; ".join(problems))

INSTALLED_APPS = [
    "config.apps.TollgateAdminConfig",  # django.contrib.admin with throttled logins
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "audit",
    "tlog",
    "access",
    "billing",
    "permits",
    "receipts",
    "mcpgateway",
    "publicsite",
    "metrics",
]

MIDDLEWARE = [
    "config.middleware.RequestIdMiddleware",
    "config.middleware.SecurityHeadersMiddleware",
    # Oversized bodies are refused before anything reads them (413).
    "common.jsonbody.BodySizeLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Counts every response by route and status; before the rate limiter, so its 429s count too.
    "metrics.middleware.MetricsMiddleware",
    "access.ratelimit.RateLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Django's message middleware, its storage made only for requests that use messages (the console).
    "config.middleware.LazyMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# Request bodies: 1 MiB at most (413 beyond; common/jsonbody.py also bounds nesting and numbers).
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=1_048_576)

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
# What config/wsgi.py serves and what the console's login page is throttled with: named here so that
# config imports no app (docs/decisions.md, Foundation).
GATEWAY_WSGI_APPLICATION = "billing.fastcharge.Gateway"
CONSOLE_LOGIN_THROTTLE = "access.login_throttle.throttle_failed_logins"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "config.middleware.csp_nonce",
            ],
        },
    },
]


def _database_url() -> str:
    url = env.str("DATABASE_URL", default="")
    if url:
        return url
    from devtools import pg

    return pg.expected_url()


_db = environ.Env.db_url_config(_database_url())
if _db["ENGINE"] != "django.db.backends.postgresql":
    raise ImproperlyConfigured("Tollgate runs on PostgreSQL only; DATABASE_URL must be postgres://...")
# Django's backend with a health check that costs no round trip (config/postgresql/base.py).
_db["ENGINE"] = "config.postgresql"
if not _db.get("HOST") and "host" in _db.get("OPTIONS", {}):
    _db["HOST"] = _db["OPTIONS"].pop("host")  # Unix socket directory
_db["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=0 if TESTING else 60)
_db["CONN_HEALTH_CHECKS"] = True
_db["ATOMIC_REQUESTS"] = False
# Server-side parameter binding: psycopg prepares a statement on a connection after it has run it
# a few times, so PostgreSQL stops parsing and planning the hot path's fixed statements on every
# call (docs/decisions.md, "Hot path"). Needs connections that live (CONN_MAX_AGE) to pay off.
# Behind a transaction-pooling PgBouncer set DB_PREPARE_THRESHOLD=0 (no prepared statements).
_db.setdefault("OPTIONS", {})["server_side_binding"] = env.bool("DB_SERVER_SIDE_BINDING", default=True)
_prepare_threshold = env.int("DB_PREPARE_THRESHOLD", default=2)
_db["OPTIONS"]["prepare_threshold"] = _prepare_threshold if _prepare_threshold > 0 else None
if TESTING:
    # Test data is disposable: skip the WAL flush on commit.
    _db.setdefault("OPTIONS", {})["options"] = "-c synchronous_commit=off"
# Several test runs can share one server when each names its own test database.
_db["TEST"] = {"NAME": env.str("TOLLGATE_TEST_DB", default=f"test_{_db['NAME']}")}
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CACHES = {"default": env.cache_url("CACHE_URL", default="locmemcache://tollgate")}

# Where rate-limit windows are counted (access/ratelimit.py): "database" (an UNLOGGED PostgreSQL
# table every worker and instance shares, the default) or "cache" (CACHE_URL; used when it names
# Redis). Tests default to the cache (cleared between tests) and exercise "database" explicitly.
_shared_cache = env.str("CACHE_URL", default="").startswith(("redis://", "rediss://"))
RATE_LIMIT_BACKEND = env.str("RATE_LIMIT_BACKEND", default="cache" if _shared_cache or TESTING else "database")
if RATE_LIMIT_BACKEND not in ("database", "cache"):
    raise ImproperlyConfigured("RATE_LIMIT_BACKEND must be 'database' or 'cache'.")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
if TESTING:
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
# Times to the second with their zone, credits with thousands separators (docs/decisions.md, Operator
# console, "Money and time read the same everywhere"; common.formatting).
FORMAT_MODULE_PATH = ["config.formats"]
USE_THOUSAND_SEPARATOR = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise expects it; assets are also served from the finders
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True  # serve straight from app directories even before collectstatic

EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="tollgate@localhost")
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", default=False)
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=10)
# Approvers' webhooks (permits.services.notifications): each attempt's timeout, the attempts before a
# delivery is given up, and the first retry's delay (doubling at each attempt, at most an hour).
WEBHOOK_TIMEOUT_SECONDS = env.float("WEBHOOK_TIMEOUT_SECONDS", default=5.0)
WEBHOOK_MAX_ATTEMPTS = env.int("WEBHOOK_MAX_ATTEMPTS", default=8)
WEBHOOK_RETRY_BASE_SECONDS = env.float("WEBHOOK_RETRY_BASE_SECONDS", default=30.0)
if WEBHOOK_TIMEOUT_SECONDS <= 0 or WEBHOOK_MAX_ATTEMPTS < 1 or WEBHOOK_RETRY_BASE_SECONDS <= 0:
    raise ImproperlyConfigured("WEBHOOK_TIMEOUT_SECONDS and WEBHOOK_RETRY_BASE_SECONDS > 0, WEBHOOK_MAX_ATTEMPTS >= 1.")

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
SESSION_COOKIE_SECURE = PRODUCTION
CSRF_COOKIE_SECURE = PRODUCTION
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Production: HTTPS only. Behind a TLS-terminating proxy set SECURE_PROXY_SSL_HEADER to the header
# it sets (for example HTTP_X_FORWARDED_PROTO); only do so when the proxy strips it from clients.
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=PRODUCTION)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31_536_000 if PRODUCTION else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
_proxy_header = env.str("SECURE_PROXY_SSL_HEADER", default="")
SECURE_PROXY_SSL_HEADER = (_proxy_header, "https") if _proxy_header else None
# The health probe answers over plain HTTP too (load balancers probe the backend directly).
SECURE_REDIRECT_EXEMPT = [r"^health$"]
LOGIN_URL = "/approvals/login"
LOGIN_REDIRECT_URL = "/approvals/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["access.authentication.APIKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["access.authentication.HasAPIKey"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["common.jsonbody.BoundedJSONParser"],
    "DEFAULT_SCHEMA_CLASS": "common.schema.TollgateAutoSchema",
    "EXCEPTION_HANDLER": "common.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_THROTTLE_CLASSES": [],
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Tollgate",
    "DESCRIPTION": (
        "Transaction-integrity gateway for consequential actions taken by autonomous agents. "
        "Each logical action binds scoped authority and metered credits to at most one dispatch "
        "and at most one debit, and leaves a signed receipt, a hash-chained audit event and a "
        "ledger entry."
    ),
    "VERSION": SERVICE_VERSION,
    "OAS_VERSION": "3.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Request records keep the spec's names (PermitCreateRequest, not PermitCreateRequestRequest).
    "COMPONENT_SPLIT_REQUEST": False,
    "ENUM_NAME_OVERRIDES": {
        # Serializers declare these value lists; one component name each.
        "APIKeyStatusEnum": [("active", "active"), ("revoked", "revoked")],
        "PermitStatusEnum": [(v, v) for v in ("active", "revoked", "expired", "exhausted")],
        "PermitRequestStatusEnum": [(v, v) for v in ("pending", "approved", "rejected", "expired")],
        "QuoteStatusEnum": [(v, v) for v in ("active", "consumed", "expired")],
        "ServiceCategoryEnum": "billing.models.ServiceCategory",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "common.schema.postprocess_alternatives",
        # Plain views (documents, pages, /health, the MCP transports) described in /openapi.json.
        "publicsite.discovery.openapi_documents_hook",
    ],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        # Django logs every 4xx as a warning with the request line; ours are expected.
        "django.request": {"level": "ERROR"},
    },
}

# --- Discovery, health, readiness check and tool catalogs (publicsite) ----------------------------
# Spec, Authentication point 7: tool catalogs are public in development, keyed on production-like
# deployments.
TOOL_CATALOG_REQUIRES_KEY = env.bool("TOOL_CATALOG_REQUIRES_KEY", default=PRODUCTION)
# /health/dependencies and the dashboard ping the upstream with this (short) timeout, in seconds.
HEALTH_UPSTREAM_TIMEOUT = env.float("HEALTH_UPSTREAM_TIMEOUT", default=2.0)
# /health/ready probes and keeps each upstream server at most once per this many seconds, answering the kept
# state in between (it is anonymous: a flood of calls must be neither a flood of authenticated upstream
# requests nor of writes; docs/decisions.md, "Upstream servers").
UPSTREAM_STATE_READINESS_INTERVAL = env.float("UPSTREAM_STATE_READINESS_INTERVAL", default=10.0)
# POST /v1/launch/preflight: agent directory registration addresses (ORACLE), content sources
# (ASSETS), the payment provider's secret key when the request gives none (KEYS), fetch timeout.
AGENT_DIRECTORY_URLS = env.list("AGENT_DIRECTORY_URLS", default=[])
CONTENT_SOURCE_URLS = env.list("CONTENT_SOURCE_URLS", default=[])
PAYMENT_SECRET_KEY = env.str("PAYMENT_SECRET_KEY", default="")
PREFLIGHT_FETCH_TIMEOUT = env.float("PREFLIGHT_FETCH_TIMEOUT", default=5.0)

# --- Metrics (GET /metrics, the metrics app) ----------------------------------------------------
# Bearer token for Prometheus scrapers (operator keys work too); empty: only operator keys.
METRICS_SCRAPE_TOKEN = env.str("METRICS_SCRAPE_TOKEN", default="")
if PRODUCTION and METRICS_SCRAPE_TOKEN and len(METRICS_SCRAPE_TOKEN) < 32:
    raise ImproperlyConfigured("refusing to start in production: METRICS_SCRAPE_TOKEN is shorter than 32 characters")
# One more family, upstream calls by server and tool (one series per tool): off by default to keep the
# cardinality bounded by the server records (docs/decisions.md, "Metrics and traces").
METRICS_TOOL_LABELS = env.bool("METRICS_TOOL_LABELS", default=False)
