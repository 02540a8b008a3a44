"""The built-in incident-investigation demo, played when the user message holds no script.

`agentops_demo` seeds an agent whose workspace starts with DEMO_STARTER_FILES, so the demo's
tool calls find the log they read.
"""

import json
import os
from typing import Any

from scripted_model.script import ScriptStep, ToolCall

DEMO_STARTER_FILES: dict[str, str] = {
    "logs/service.log": """\
2025-03-14T09:58:02Z INFO  api            request_id=7f1c POST /v1/charges 201 112ms
2025-03-14T09:58:40Z INFO  payments-worker consumed job=charge.capture id=88213 in 340ms
2025-03-14T09:59:11Z WARN  payments-worker rss=1.71GiB approaching memory limit 2GiB
2025-03-14T09:59:37Z WARN  payments-worker rss=1.94GiB batch=settlement-2025-03-14 rows=48211
2025-03-14T09:59:52Z ERROR payments-worker OOMKilled (exit 137) while loading settlement batch
2025-03-14T09:59:53Z INFO  supervisor     payments-worker restarted (restart_count=1)
2025-03-14T10:00:31Z WARN  payments-worker rss=1.97GiB batch=settlement-2025-03-14 rows=48211
2025-03-14T10:00:44Z ERROR payments-worker OOMKilled (exit 137) while loading settlement batch
2025-03-14T10:00:45Z INFO  supervisor     payments-worker restarted (restart_count=2)
2025-03-14T10:00:52Z WARN  api            request_id=91ab POST /v1/charges 202 queued (queue_depth=412)
2025-03-14T10:01:20Z ERROR payments-worker OOMKilled (exit 137) while loading settlement batch
2025-03-14T10:01:21Z INFO  supervisor     payments-worker restarted (restart_count=3)
2025-03-14T10:01:22Z WARN  supervisor     payments-worker backoff 30s (crash loop detected)
2025-03-14T10:01:40Z WARN  api            request_id=a03e POST /v1/charges 202 queued (queue_depth=1290)
2025-03-14T10:01:58Z ERROR alerts         PaymentsQueueBacklog firing: queue_depth=1804 > 1000 for 60s
2025-03-14T10:02:03Z INFO  deploy         config change: SETTLEMENT_BATCH_SIZE 5000 -> 50000 (rev 4c2e91a)
2025-03-14T10:02:10Z ERROR payments-worker OOMKilled (exit 137) while loading settlement batch
2025-03-14T10:02:11Z INFO  supervisor     payments-worker restarted (restart_count=4)
2025-03-14T10:02:12Z WARN  supervisor     payments-worker backoff 60s (crash loop detected)
2025-03-14T10:02:30Z ERROR api            request_id=c77d POST /v1/charges 503 payments backlog full
""",
}

DEMO_RESTART_COMMAND = (
    'echo "restarting payments-worker with SETTLEMENT_BATCH_SIZE=5000" && mkdir -p state && '
    'date -u +"restarted_at=%Y-%m-%dT%H:%M:%SZ" > state/payments-worker.restarted && '
    'echo "payments-worker restarted"'
)

DEMO_REPORT = (
    "## Incident report: payments-worker crash loop\n\n"
    "**What happened:** the payments worker was OOM-killed (exit 137) four times while loading the "
    "settlement batch, and the supervisor put it into a crash-loop backoff. The payments queue backed up "
    "past 1,800 jobs and the API started answering 503.\n\n"
    "**Likely cause:** a config change raised SETTLEMENT_BATCH_SIZE from 5000 to 50000, so one batch "
    "no longer fits in the worker's 2 GiB memory limit.\n\n"
    "**Action:** I asked to restart the worker with the smaller batch size (that command needed a "
    "reviewer's approval) and then checked the restart marker. The tool results below show what "
    "actually happened.\n\n"
    "**Follow-up:** revert rev 4c2e91a and add a memory alert below the limit.\n\n"
    "Tool results this turn:\n{results}"
)


# The demo's status API (served by this server at /demo/status, `make run` sets both): it wants
# a bearer token the agent never sees, the secret `status_api_token` of the team's vault.
DEMO_STATUS_URL_ENV = "AGENTOPS_DEMO_STATUS_URL"
DEMO_STATUS_TOKEN_ENV = "AGENTOPS_DEMO_STATUS_TOKEN"
DEMO_STATUS_SECRET = "status_api_token"


def demo_status_call() -> dict[str, Any] | None:
    """The status API call of the demo, when `make run` configured one."""
    url = os.environ.get(DEMO_STATUS_URL_ENV, "")
    if not url:
        return None
    return {"method": "GET", "url": url, "headers": {"Authorization": f"Bearer {{{{secret:{DEMO_STATUS_SECRET}}}}}"}}


def demo_steps() -> list[ScriptStep]:
    """The demo as a script: look around, read the log, (with a status API: check it, with a
    secret from the vault), ask to restart (needs approval), check, report."""
    calls: list[tuple[str, dict[str, Any]]] = [("list_files", {"path": "."}),
                                               ("read_file", {"path": "logs/service.log"})]
    status = demo_status_call()
    if status is not None:
        calls.append(("http_request", status))
    calls += [("run_command", {"command": DEMO_RESTART_COMMAND}),
              ("read_file", {"path": "state/payments-worker.restarted"})]
    steps = [ScriptStep(index, (ToolCall(name=name, arguments=json.dumps(arguments)),))
             for index, (name, arguments) in enumerate(calls)]
    return [*steps, ScriptStep(len(calls), (), DEMO_REPORT)]
