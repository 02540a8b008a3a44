"""The runner protocol, shared by the server (hosts_app.runners) and the runner: standard library only.

A job is a JSON object signed with HMAC-SHA256 under a per-runner key derived from the runner's
token (``signing_key``), so the key never travels and the server stores only the token's hash and
the key. The runner accepts a job only when (1) the signature verifies, (2) it names this runner
and has not expired, and (3) the run spec it carries hashes to the approval hash it carries, and
that spec describes exactly the tool, arguments, timeout and network to run. A compromised network
path can therefore neither forge a job nor change what an approved job runs.
"""

import hashlib
import hmac
import json
import time
from typing import Any

SIGNING_CONTEXT = b"agentops-runner-job-signing-v1"
TOKEN_PREFIX = "aor_"


def canonical_json(value: Any) -> str:
    """The same spelling as ``agentops.domain.canonical_json`` (what approval hashes are over)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def signing_key(token: str) -> str:
    return hmac.new(token.encode(), SIGNING_CONTEXT, hashlib.sha256).hexdigest()


def sign(key: str, job: dict[str, Any]) -> str:
    return hmac.new(key.encode(), canonical_json(job).encode(), hashlib.sha256).hexdigest()


class JobRefused(Exception):
    """The job does not verify; it must not run."""


def spec_sha256(spec: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(spec).encode()).hexdigest()


def verify_job(*, key: str, runner: str, job: dict[str, Any], signature: str, now: float | None = None) -> None:
    """Raise JobRefused unless the job is authentic, for this runner, current, and what was approved."""
    if not isinstance(job, dict) or not isinstance(signature, str):
        raise JobRefused("malformed job")
    if not hmac.compare_digest(sign(key, job), signature):
        raise JobRefused("bad signature")
    if job.get("runner") != runner:
        raise JobRefused(f"job is for runner {job.get('runner')!r}")
    if float(job.get("expires_at", 0)) < (now if now is not None else time.time()):
        raise JobRefused("job expired")
    if job.get("type") == "manifest_check":
        return
    spec = job.get("spec")
    if not isinstance(spec, dict) or spec_sha256(spec) != job.get("approval_sha256"):
        raise JobRefused("approval hash does not match the run spec")
    for field, spec_field in (("tool", "tool"), ("arguments", "arguments"), ("timeout_seconds", "timeout_seconds"),
                              ("network", "network")):
        if job.get(field) != spec.get(spec_field):
            raise JobRefused(f"the job's {field} is not the approved one")
