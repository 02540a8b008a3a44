"""agentops settings: one module, read from the environment (see .env.example)."""

import os
import sys
from datetime import timedelta
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env")

DEBUG = env.bool("DJANGO_DEBUG", default=False)
# Demo mode: `make run` and the test suite (a local demo on one machine, demo users, the
# development secret key). Never set it on a real deployment.
AGENTOPS_DEMO = env.bool("AGENTOPS_DEMO", default=False)
DEVELOPMENT_SECRET_KEY = "dev-insecure-change-me-" + "0" * 32
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default=DEVELOPMENT_SECRET_KEY)
if SECRET_KEY.startswith(("dev-insecure", "change-me")) and not (DEBUG or AGENTOPS_DEMO):
    # Sessions, CSRF tokens and password-reset links are signed with it: a published key lets
    # anyone forge a logged-in session.
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY is the development key (or the .env.example placeholder): refusing to start. "
        "Set DJANGO_SECRET_KEY to a long random secret, e.g. "
        "python -c 'import secrets; print(secrets.token_urlsafe(50))'; "
        "or, for a local demo only, DJANGO_DEBUG=1 or AGENTOPS_DEMO=1.")
# Old secrets still accepted while DJANGO_SECRET_KEY rotates (sessions, and the customer runners'
# job-signing keys, derived from the secret they were created under: hosts_app/runner_keys.py).
SECRET_KEY_FALLBACKS = env.list("DJANGO_SECRET_KEY_FALLBACKS", default=[])
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    # daphne's app only makes `runserver` serve ASGI; importing it installs Twisted's reactor, ~0.4 s
    # of CPU at every start of every process (workers, gateways, the test suite's ~150 processes),
    # and the web processes run daphne's own command (agentops.webserve), which installs it first.
    *(["daphne"] if "runserver" in sys.argv[1:2] else []),
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "channels",
    "ninja",  # its Swagger UI assets come from our static files, not a CDN
    "axes",
    "tools_app",
    "sessions_app",
    "approvals_app",
    "notify_app",
    "vault_app",
    "fanout_app",
    "mcp_app",
    "hosts_app",
    "agentops",
]

MIDDLEWARE = [
    "agentops.middleware.StreamReleasesConnectionMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "agentops.middleware.RequestSizeLimitMiddleware",
    "agentops.middleware.NulRefusalMiddleware",
    "agentops.middleware.ApiErrorShapeMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "agentops.idempotency.IdempotencyMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "agentops.middleware.ContentSecurityPolicyMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks
]

AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # refuses a locked-out username+address before the password is checked
    "agentops.backends.OneQueryModelBackend",  # ModelBackend, its permissions in one query
]
# Login throttling (django-axes): after AXES_FAILURE_LIMIT failed logins for one username from one
# address, further attempts are refused (429) for AXES_COOLOFF_TIME; a success resets the count.
AXES_FAILURE_LIMIT = env.int("AGENTOPS_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("AGENTOPS_LOGIN_COOLOFF_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# Behind a proxy, the client address is the first of X-Forwarded-For (set AGENTOPS_BEHIND_PROXY).
AXES_IPWARE_META_PRECEDENCE_ORDER = (["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"]
                                     if env.bool("AGENTOPS_BEHIND_PROXY", default=False) else ["REMOTE_ADDR"])

ROOT_URLCONF = "agentops.urls"
ASGI_APPLICATION = "agentops.asgi.application"
WSGI_APPLICATION = None

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
            ],
        },
    },
]

# Database: PostgreSQL in production and CI (DATABASE_URL), SQLite with WAL by default.
DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'var' / 'agentops.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    (BASE_DIR / "var").mkdir(exist_ok=True)
    DATABASES["default"]["ENGINE"] = "agentops.sqlite_backend"  # writers queue on a lock file
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=20000;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / "var" / "test.sqlite3")}
else:
    # A bounded pool per process: a thread takes a connection for a unit of work and hands it back
    # (CONN_MAX_AGE=0 closes into the pool). Persistent per-thread connections leak under ASGI and
    # thread pools: one per thread, until PostgreSQL refuses new clients.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        # Names the process kind in pg_stat_activity (the benchmarks count connections by it).
        "application_name": env.str("DATABASE_APPLICATION_NAME", default="agentops"),
        # Parameters bound by the server, not quoted into the SQL text in Python: the engine's
        # one-statement record carries dozens of them per step.
        "server_side_binding": env.bool("DATABASE_SERVER_SIDE_BINDING", default=True),
        "prepare_threshold": env.int("DATABASE_PREPARE_THRESHOLD", default=5) or None,
        "pool": {"min_size": env.int("AGENTOPS_DB_POOL_MIN", default=1),
                 "max_size": env.int("AGENTOPS_DB_POOL_SIZE", default=10),
                 "timeout": env.float("AGENTOPS_DB_POOL_TIMEOUT", default=30.0)},
    }
    if env.str("DATABASE_TEST_NAME", default=""):  # parallel test runs on one server
        DATABASES["default"]["TEST"] = {"NAME": env.str("DATABASE_TEST_NAME")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# HTTP requests one web process runs in Django at once (agentops.middleware.RequestGateASGI); the
# others wait their turn without a thread or a connection. Keep it under AGENTOPS_DB_POOL_SIZE:
# the process's WebSocket/SSE reads and its announcer take connections from the same pool.
AGENTOPS_WEB_CONCURRENCY = env.int("AGENTOPS_WEB_CONCURRENCY", default=4)
# Paths whose requests wait without a database connection (long-polls) and take no place there.
AGENTOPS_WEB_UNGATED_PREFIXES = ("/api/runner/jobs/next",)
# Paths whose views are async (the runner's API: its long-poll waits on Redis): served by Django's
# own ASGI handler; every other request runs in one worker-thread hop (agentops.asgi_handler).
AGENTOPS_ASYNC_VIEW_PREFIXES = ("/api/runner/",)

# Redis: the Celery broker and the Channels layer. `make run` starts an embedded one when unset.
REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "agentops.channel_layer.RedisChannelLayer",  # survives a Redis restart
        "CONFIG": {
            "hosts": [REDIS_URL],
            "capacity": env.int("AGENTOPS_CHANNEL_CAPACITY", default=1000),
            "expiry": 60,
        },
    },
}

# Celery: at-least-once delivery; every task is idempotent and claims its work.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "engine"
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
AGENTOPS_MAX_TOOL_TIMEOUT = env.int("AGENTOPS_MAX_TOOL_TIMEOUT", default=3600)
# Longer than the longest tool timeout: otherwise a long command is redelivered to a
# second worker while the first still runs.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": AGENTOPS_MAX_TOOL_TIMEOUT + 600,
    # kombu's Redis pool defaults to 10 connections: under load acks fail ("Couldn't ack") and the
    # unacked messages come back as duplicates. Size it above the worker's concurrency.
    "max_connections": env.int("AGENTOPS_BROKER_MAX_CONNECTIONS", default=64),
}
CELERY_TASK_ROUTES = {
    "sessions_app.tasks.turn_advance_task": {"queue": "engine"},
    "sessions_app.tasks.tool_run_task": {"queue": "sandbox"},
    "sessions_app.tasks.recovery_sweep_task": {"queue": "engine"},
    "sessions_app.tasks.turn_kick_task": {"queue": "engine"},
    "sessions_app.tasks.retention_sweep_task": {"queue": "engine"},
    "hosts_app.tasks.host_sweep_task": {"queue": "engine"},
    "approvals_app.tasks.review_sweep_task": {"queue": "engine"},
    # Deliveries wait on other people's servers: a queue of their own, consumed by a worker of its
    # own (make run's "notifier"), so a slow receiver never holds the threads that run the engine.
    "notify_app.tasks.delivery_send_task": {"queue": "notify"},
    "notify_app.tasks.outbox_sweep_task": {"queue": "notify"},
}
CELERY_BEAT_SCHEDULE = {
    "recovery-sweep": {"task": "sessions_app.tasks.recovery_sweep_task",
                       "schedule": env.float("AGENTOPS_SWEEP_SECONDS", default=15.0)},
    "host-sweep": {"task": "hosts_app.tasks.host_sweep_task",
                   "schedule": env.float("AGENTOPS_SWEEP_SECONDS", default=15.0)},
    "retention-sweep": {"task": "sessions_app.tasks.retention_sweep_task",
                        "schedule": env.float("AGENTOPS_RETENTION_SWEEP_SECONDS", default=3600.0)},
    "review-sweep": {"task": "approvals_app.tasks.review_sweep_task",
                     "schedule": env.float("AGENTOPS_REVIEW_SWEEP_SECONDS", default=10.0)},
    "outbox-sweep": {"task": "notify_app.tasks.outbox_sweep_task",
                     "schedule": env.float("AGENTOPS_REVIEW_SWEEP_SECONDS", default=10.0)},
}

# agentops


def _default_workspace_root() -> Path:
    """var/workspaces when the sandbox uid can reach it, else a directory under /var/tmp.

    The sandbox runs commands as an unprivileged uid, which needs o+x on every directory above
    its workspace; a checkout under a private home directory (0700) does not allow that.
    """
    preferred = BASE_DIR / "var" / "workspaces"
    if all(os.stat(p).st_mode & 0o001 for p in [*preferred.parents][: len(preferred.parents) - 1]
           if p.exists() and p != preferred):
        return preferred
    return Path("/var/tmp") / f"agentops-{os.getuid()}" / "workspaces"


AGENTOPS_WORKSPACE_ROOT = Path(env.str("AGENTOPS_WORKSPACE_ROOT", default=str(_default_workspace_root())))
AGENTOPS_ARTIFACT_ROOT = Path(env.str("AGENTOPS_ARTIFACT_ROOT", default=str(BASE_DIR / "var" / "artifacts")))
AGENTOPS_SANDBOX_ALLOW_UNSAFE = env.bool("AGENTOPS_SANDBOX_ALLOW_UNSAFE", default=False)
AGENTOPS_SANDBOX_UID = env.int("AGENTOPS_SANDBOX_UID", default=65534)
AGENTOPS_SANDBOX_GID = env.int("AGENTOPS_SANDBOX_GID", default=AGENTOPS_SANDBOX_UID)
# A session's stdio MCP server process is kept this long after its last call (mcp_app.pool);
# 0 = a fresh server process per call.
AGENTOPS_MCP_STDIO_IDLE_SECONDS = env.float("AGENTOPS_MCP_STDIO_IDLE_SECONDS", default=300)
AGENTOPS_FORBID_SELF_APPROVAL = env.bool("AGENTOPS_FORBID_SELF_APPROVAL", default=True)
# API decisions must name the run-spec hash the reviewer saw; off only for trusted clients.
AGENTOPS_API_REQUIRE_ARGUMENTS_SHA256 = env.bool("AGENTOPS_API_REQUIRE_ARGUMENTS_SHA256", default=True)
# A remembered approval (a grant) ends with the turn it was given in ("turn") or lasts for the
# session ("session"); AGENTOPS_GRANT_TTL_SECONDS (0 = none) ends it earlier in either case.
AGENTOPS_GRANT_SCOPE = env.str("AGENTOPS_GRANT_SCOPE", default="turn")
AGENTOPS_GRANT_TTL_SECONDS = env.int("AGENTOPS_GRANT_TTL_SECONDS", default=0)
# Streams (WebSocket, SSE): re-check the credential and access this often (a revoked token or a
# removed membership closes the stream within it), live at most this long (then ask the client to
# reconnect), and replay from the database at most this often per user.
AGENTOPS_STREAM_RECHECK_SECONDS = env.float("AGENTOPS_STREAM_RECHECK_SECONDS", default=30.0)
AGENTOPS_STREAM_MAX_SECONDS = env.float("AGENTOPS_STREAM_MAX_SECONDS", default=3600.0)
AGENTOPS_STREAM_REPLAYS_PER_MINUTE = env.int("AGENTOPS_STREAM_REPLAYS_PER_MINUTE", default=60)
# Live push messages carry the announcer's stage times (commit, picked, listeners checked, rendered):
# what proof/load.py splits the push latency by. Off by default (a few bytes per event).
AGENTOPS_PUSH_TIMINGS = env.bool("AGENTOPS_PUSH_TIMINGS", default=False)
# While an announcer process runs (`manage.py announcer`, part of `make run`), writers hand it their
# committed events through a Redis stream instead of rendering and sending them themselves
# (sessions_app/announce.py); off: every writer announces its own events.
AGENTOPS_ANNOUNCE_RELAY = env.bool("AGENTOPS_ANNOUNCE_RELAY", default=True)
# How many announcer processes share the sessions (`manage.py announcer --shard k`, k < this): each
# announces the sessions whose id hashes to its shard, in commit order; a shard with none alive is
# announced by the writers themselves. Every process must be given the same value.
AGENTOPS_ANNOUNCERS = env.int("AGENTOPS_ANNOUNCERS", default=1)
AGENTOPS_APPROVAL_TTL_SECONDS = env.int("AGENTOPS_APPROVAL_TTL_SECONDS", default=24 * 3600)
# The reviewer's workflow (issue 17): a claim lapses after AGENTOPS_CLAIM_SECONDS; the review sweep
# (claims, escalations) and the notification outbox run every AGENTOPS_REVIEW_SWEEP_SECONDS.
AGENTOPS_CLAIM_SECONDS = env.int("AGENTOPS_CLAIM_SECONDS", default=15 * 60)
AGENTOPS_REVIEW_SWEEP_SECONDS = env.float("AGENTOPS_REVIEW_SWEEP_SECONDS", default=10.0)
# Notifications (notify_app): links in emails and webhooks point at AGENTOPS_PUBLIC_URL; a failed
# delivery is retried after base × 2^(n-1) seconds (capped), at most AGENTOPS_NOTIFY_MAX_ATTEMPTS
# times; a webhook attempt has a total deadline of AGENTOPS_NOTIFY_TIMEOUT_SECONDS (connect, send and
# the whole answer); an email's one-time link is valid AGENTOPS_NOTIFY_LINK_SECONDS. Email goes through
# Django's EMAIL_BACKEND (console by default; make run writes files under var/mail).
AGENTOPS_PUBLIC_URL = env.str("AGENTOPS_PUBLIC_URL", default="http://127.0.0.1:8000")
AGENTOPS_NOTIFY_BACKOFF_SECONDS = env.float("AGENTOPS_NOTIFY_BACKOFF_SECONDS", default=10.0)
AGENTOPS_NOTIFY_BACKOFF_MAX_SECONDS = env.float("AGENTOPS_NOTIFY_BACKOFF_MAX_SECONDS", default=3600.0)
AGENTOPS_NOTIFY_MAX_ATTEMPTS = env.int("AGENTOPS_NOTIFY_MAX_ATTEMPTS", default=8)
AGENTOPS_NOTIFY_TIMEOUT_SECONDS = env.float("AGENTOPS_NOTIFY_TIMEOUT_SECONDS", default=10.0)
AGENTOPS_NOTIFY_LINK_SECONDS = env.int("AGENTOPS_NOTIFY_LINK_SECONDS", default=7 * 24 * 3600)
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
EMAIL_FILE_PATH = env.str("EMAIL_FILE_PATH", default=str(BASE_DIR / "var" / "mail"))
# The SMTP backend's server; its timeout bounds each socket operation (Django's default: none, and a
# server that stops answering held a notify thread for good).
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", default=False)
EMAIL_TIMEOUT = env.float("EMAIL_TIMEOUT", default=AGENTOPS_NOTIFY_TIMEOUT_SECONDS)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="agentops@localhost")
AGENTOPS_LEASE_SECONDS = env.int("AGENTOPS_LEASE_SECONDS", default=60)
# The sweeper's kicks of quiet turns (a wake-up lost in a Redis blip): only turns with nothing in
# flight and no event for this long, at most this many per sweep, none while the engine queue is
# this deep (a saturated box is busy, not stuck), and one kick in the queue per turn at a time.
# A running command's live output (tool.progress events): at most one batch per interval, the
# text capped per step (the full capped output stays in the result), and at most so many batches.
AGENTOPS_PROGRESS_INTERVAL_SECONDS = env.float("AGENTOPS_PROGRESS_INTERVAL_SECONDS", default=0.5)
AGENTOPS_PROGRESS_MAX_BYTES = env.int("AGENTOPS_PROGRESS_MAX_BYTES", default=64 * 1024)
AGENTOPS_PROGRESS_MAX_EVENTS = env.int("AGENTOPS_PROGRESS_MAX_EVENTS", default=500)
# Retention: the workspace of a session with no turn running and no event for this long is
# removed (its artifacts are stored apart and stay); API idempotency records expire after
# AGENTOPS_IDEMPOTENCY_TTL_HOURS. 0 keeps them forever. Celery beat runs it every
# AGENTOPS_RETENTION_SWEEP_SECONDS; ``manage.py retention_sweep`` runs it by hand.
AGENTOPS_WORKSPACE_TTL_HOURS = env.float("AGENTOPS_WORKSPACE_TTL_HOURS", default=7 * 24)
AGENTOPS_IDEMPOTENCY_TTL_HOURS = env.float("AGENTOPS_IDEMPOTENCY_TTL_HOURS", default=24)
# Subagents (fanout_app): how deep children may spawn children, and how many one call may start.
AGENTOPS_SUBAGENT_MAX_DEPTH = env.int("AGENTOPS_SUBAGENT_MAX_DEPTH", default=2)
AGENTOPS_SUBAGENT_MAX_FANOUT = env.int("AGENTOPS_SUBAGENT_MAX_FANOUT", default=8)
AGENTOPS_BATCH_MAX_ROWS = env.int("AGENTOPS_BATCH_MAX_ROWS", default=1000)
AGENTOPS_KICK_QUIET_SECONDS = env.float("AGENTOPS_KICK_QUIET_SECONDS", default=30.0)
AGENTOPS_KICK_MAX_PER_SWEEP = env.int("AGENTOPS_KICK_MAX_PER_SWEEP", default=100)
AGENTOPS_KICK_QUEUE_LIMIT = env.int("AGENTOPS_KICK_QUEUE_LIMIT", default=1000)
# One model request (a streamed answer included); a model step's lease covers every retry of it.
AGENTOPS_MODEL_TIMEOUT_SECONDS = env.float("AGENTOPS_MODEL_TIMEOUT_SECONDS", default=120.0)
AGENTOPS_MODEL_BASE_URL = env.str("OPENAI_BASE_URL", default="")
# The environment variables an agent may name as its model API key: an admin must not be able to
# send DATABASE_URL or DJANGO_SECRET_KEY to a model URL of their choosing.
AGENTOPS_MODEL_KEY_ENVS = env.list("AGENTOPS_MODEL_KEY_ENVS", default=["OPENAI_API_KEY"])
# The model gateway: model calls in flight per gateway process, its database threads, and how
# long a stopping gateway lets its calls finish.
AGENTOPS_GATEWAY_CONCURRENCY = env.int("AGENTOPS_GATEWAY_CONCURRENCY", default=500)
# The database threads share the process's GIL with the event loop and every statement waits for
# it again: fewer threads commit faster, more overlap more database work. bench/concurrency.py,
# 2026-12-03: make run's one gateway (200 sessions) took 2.00-2.08x the ideal with 8 and 2.42-2.60x
# with 4; each of the multi layout's two gateways (N = 300) committed faster with 4 (event created
# -> committed p50 44-48 -> 28-31 ms, p99 298-394 -> 190-217 ms, three runs each), the README's
# layout passes --db-threads 2 where the gateways share the cores with daphne (4 on hosts of their own).
AGENTOPS_GATEWAY_DB_THREADS = env.int("AGENTOPS_GATEWAY_DB_THREADS", default=8)
AGENTOPS_GATEWAY_DRAIN_SECONDS = env.float("AGENTOPS_GATEWAY_DRAIN_SECONDS", default=30.0)
# How long a gateway drives one turn (its model calls and the read-only tools between them) before
# it hands the turn back to the stream and a Celery tick; a gateway with every slot taken hands a
# turn back after its share (``tick.INLINE_SECONDS``), so that waiting turns get a slot. A coroutine
# costs nothing while the model thinks; a hand-over costs a tick in a worker, a stream entry and the
# conversation loaded again, which a busy machine cannot afford every 30 s of every turn.
AGENTOPS_GATEWAY_DRIVE_SECONDS = env.float("AGENTOPS_GATEWAY_DRIVE_SECONDS", default=600.0)
# How often the gateway looks whether the steps of its calls in flight were settled elsewhere (a
# cancelled turn): it then lets go of their calls.
AGENTOPS_GATEWAY_WATCH_SECONDS = env.float("AGENTOPS_GATEWAY_WATCH_SECONDS", default=2.0)
AGENTOPS_GATEWAY_RECLAIM_SECONDS = env.float("AGENTOPS_GATEWAY_RECLAIM_SECONDS", default=30.0)
AGENTOPS_HTTP_ALLOWED_HOSTS = env.list("AGENTOPS_HTTP_ALLOWED_HOSTS", default=[])
AGENTOPS_HTTP_ALLOW_PRIVATE = env.bool("AGENTOPS_HTTP_ALLOW_PRIVATE", default=False)
# The secrets vault's Fernet keys, comma-separated: the first encrypts, all decrypt (rotation:
# vault_app/crypto.py). Required; with AGENTOPS_DEMO and none set, a demo key is derived from SECRET_KEY.
AGENTOPS_SECRET_KEYS = env.list("AGENTOPS_SECRET_KEYS", default=[])
# A secret's value that was replaced or deleted stays in its team's redaction set this many days
# (a file written while it was live can be read back later; a rotated credential often still works).
AGENTOPS_SECRET_RETIRED_REDACT_DAYS = env.float("AGENTOPS_SECRET_RETIRED_REDACT_DAYS", default=90.0)
# A user's sessions working at once; a new one past it is refused with 429 (empty: no limit).
AGENTOPS_MAX_ACTIVE_SESSIONS_PER_USER: int | None = env.int("AGENTOPS_MAX_ACTIVE_SESSIONS_PER_USER", default=None)
AGENTOPS_MAX_REQUEST_BYTES = env.int("AGENTOPS_MAX_REQUEST_BYTES", default=1_000_000)
DATA_UPLOAD_MAX_MEMORY_SIZE = AGENTOPS_MAX_REQUEST_BYTES

AUTH_PASSWORD_VALIDATORS: list[dict[str, object]] = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# HTTPS and the proxy in front (README, "Deploying"): all off by default for `make run` on http://localhost.
SESSION_ENGINE = "agentops.browser_sessions"  # Django's db sessions, read with SQL compiled once
SESSION_COOKIE_SECURE = env.bool("AGENTOPS_SECURE_COOKIES", default=False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SECURE_HSTS_SECONDS = env.int("AGENTOPS_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("AGENTOPS_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_SSL_REDIRECT = env.bool("AGENTOPS_SSL_REDIRECT", default=False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # the load balancer's probe speaks plain HTTP
if env.bool("AGENTOPS_BEHIND_PROXY", default=False):
    # Trust the proxy's word on the scheme; only when the proxy overwrites this header itself.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    # Published files, uploaded by the sandbox host that captured them (agentops/storage.py).
    "artifacts": {"BACKEND": env.str("AGENTOPS_ARTIFACT_STORAGE", default="agentops.storage.ArtifactStorage")},
}
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "var" / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    # httpx logs every request's URL at INFO: an http_request URL may carry a resolved secret.
    "loggers": {"django.channels.server": {"level": "WARNING"}, "daphne": {"level": "WARNING"},
                "httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}},
}

# Sandbox hosts (hosts_app, README "Several machines"). A worker started with AGENTOPS_SANDBOX_HOST
# is that host: it registers (pool, labels, capacity, self-test), heartbeats and consumes the
# queue sandbox.<name>. AGENTOPS_WORKSPACE_HOST names the host whose workspace root this process
# shares: the engine may open those workspaces itself (one machine); "" on engine/llm machines of
# a multi-host deployment, which then never open a workspace.
AGENTOPS_SANDBOX_HOST = env.str("AGENTOPS_SANDBOX_HOST", default="")
AGENTOPS_SANDBOX_HOST_POOL = env.str("AGENTOPS_SANDBOX_HOST_POOL", default="default")
AGENTOPS_SANDBOX_HOST_LABELS = env.list("AGENTOPS_SANDBOX_HOST_LABELS", default=[])
AGENTOPS_SANDBOX_HOST_CAPACITY = env.int("AGENTOPS_SANDBOX_HOST_CAPACITY", default=8)
AGENTOPS_WORKSPACE_HOST = env.str("AGENTOPS_WORKSPACE_HOST", default=AGENTOPS_SANDBOX_HOST or "local")
AGENTOPS_HOST_HEARTBEAT_SECONDS = env.float("AGENTOPS_HOST_HEARTBEAT_SECONDS", default=5.0)
# No heartbeat for this long: offline. An interrupted command of an offline host waits this long
# for the host to return (its manifest is then checked there) before a reviewer decides.
AGENTOPS_HOST_OFFLINE_SECONDS = env.float("AGENTOPS_HOST_OFFLINE_SECONDS", default=20.0)
AGENTOPS_HOST_GIVE_UP_SECONDS = env.float("AGENTOPS_HOST_GIVE_UP_SECONDS", default=600.0)
# Customer runners: how long one long-poll waits for a job.
AGENTOPS_RUNNER_POLL_SECONDS = env.float("AGENTOPS_RUNNER_POLL_SECONDS", default=20.0)
