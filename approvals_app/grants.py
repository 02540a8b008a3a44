"""Grants: a remembered confirm_once approval lets one tool run unasked in one session, for exact
arguments or a stated pattern, while the tool runs as the reviewer saw it (its run spec without the
arguments); each use is an event, any reviewer of the team revokes one."""

import fnmatch
import hashlib
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from agentops.domain import InvalidArguments, NotFound, PermissionDenied, canonical_json, joins_transaction
from agentops.permissions import DECIDE_APPROVALS
from agentops.teams import REVIEW_ROLES, has_team_role
from approvals_app.models import ApprovalAudit, ApprovalGrant, ApprovalRequest
from sessions_app.events import event_record
from sessions_app.locks import locked_with_session
from tools_app.binding import spec_differences, tool_spec_sha256


def args_sha256(arguments: Any) -> str:
    """The canonical-JSON SHA-256 of a call's arguments (what an exact grant names)."""
    return hashlib.sha256(canonical_json(arguments).encode()).hexdigest()


def pattern_matches(pattern: dict[str, str], arguments: Any) -> bool:
    """Every argument of the call is named by the pattern and its value (as text; JSON for
    non-strings) matches the glob (fnmatch, case-sensitive). An argument the pattern does not
    name refuses the match: a reviewer who allowed ``{"path": "notes/*"}`` did not allow
    whatever other argument the model adds."""
    if not isinstance(arguments, dict) or set(arguments) - set(pattern):
        return False
    for name, glob in pattern.items():
        if name not in arguments:
            return False
        value = arguments[name]
        text = value if isinstance(value, str) else canonical_json(value)
        if not fnmatch.fnmatchcase(text, glob):
            return False
    return True


def validate_pattern(pattern: Any, arguments: Any) -> None:
    if (not isinstance(pattern, dict) or not pattern
            or not all(isinstance(k, str) and isinstance(v, str) and len(v) <= 500 for k, v in pattern.items())):
        raise InvalidArguments("A grant pattern maps argument names to glob patterns (text)",
                               details={"field": "grant_pattern"})
    if not pattern_matches(pattern, arguments):
        raise InvalidArguments("The grant pattern must match the call you approve (and name every argument)",
                               details={"field": "grant_pattern"})


def grant_public(grant: ApprovalGrant) -> dict[str, Any]:
    return {"grant_id": grant.pk, "tool": grant.tool_name, "arguments_sha256": grant.arguments_sha256 or None,
            "argument_pattern": grant.argument_pattern, "turn_id": str(grant.turn_id) if grant.turn_id else None,
            "expires_at": grant.expires_at.isoformat() if grant.expires_at else None, "uses": grant.uses}


def grant_create(approval: ApprovalRequest, *, actor: User, pattern: dict[str, str] | None) -> ApprovalGrant:
    """The narrow grant of a remembered approval: this session, this tool, these exact (effective)
    arguments or the stated pattern; ends with the turn (AGENTOPS_GRANT_SCOPE=turn, the default)
    or at AGENTOPS_GRANT_TTL_SECONDS, whichever comes first."""
    ttl = settings.AGENTOPS_GRANT_TTL_SECONDS
    return ApprovalGrant.objects.create(
        session_id=approval.session_id, tool_name=approval.tool_name,
        arguments_sha256="" if pattern is not None else args_sha256(approval.effective_arguments),
        argument_pattern=pattern,
        turn_id=approval.turn_id if settings.AGENTOPS_GRANT_SCOPE == "turn" else None,
        expires_at=timezone.now() + timedelta(seconds=ttl) if ttl else None,
        tool_spec_sha256=tool_spec_sha256(approval.run_spec) if approval.run_spec else "",
        granted_by=actor, source_request=approval)


@joins_transaction
def grant_use(*, session_id: uuid.UUID, turn_id: uuid.UUID, step_id: uuid.UUID, tool_name: str,
              arguments: Any, spec: dict[str, Any]) -> ApprovalGrant | None:
    """The live grant that covers this call, with its use counted and recorded as a
    ``grant.used`` event; None when none does (the caller asks a reviewer). Session locked.
    ``spec``: the call's run spec as it would run now. A grant binds the tool as the reviewer
    saw it (version, network, timeout, environment, sandbox backend): one whose tool has changed
    since is ended (``grant.invalidated``, saying what changed) and covers nothing."""
    now = timezone.now()
    candidates = (ApprovalGrant.objects.filter(session_id=session_id, tool_name=tool_name, revoked_at__isnull=True)
                  .filter(Q(turn__isnull=True) | Q(turn_id=turn_id)).exclude(expires_at__lte=now)
                  .select_related("source_request").order_by("created_at"))
    digest = args_sha256(arguments)
    current = tool_spec_sha256(spec)
    for grant in candidates:
        if grant.arguments_sha256 == digest or (grant.argument_pattern is not None and not grant.arguments_sha256
                                                and pattern_matches(grant.argument_pattern, arguments)):
            if grant.tool_spec_sha256 != current:
                _grant_invalidate(grant, spec=spec, step_id=step_id, turn_id=turn_id, now=now)
                continue
            ApprovalGrant.objects.filter(pk=grant.pk).update(uses=F("uses") + 1, last_used_at=now)
            grant.uses += 1
            event_record(session_id=session_id, turn_id=turn_id, step_id=step_id, type="grant.used",
                         payload={**grant_public(grant), "arguments_sha256": digest})
            return grant
    return None


def _grant_invalidate(grant: ApprovalGrant, *, spec: dict[str, Any], step_id: uuid.UUID, turn_id: uuid.UUID,
                      now: Any) -> None:
    approved = grant.source_request.run_spec if grant.source_request is not None else {}
    changed = [key for key in spec_differences(approved or {}, spec) if key not in ("arguments", "limits")]
    grant.revoked_at = now
    grant.revoked_reason = (f"The tool changed since it was granted ({', '.join(changed)})." if changed and approved
                            else "The tool changed since it was granted.")[:300]
    grant.save(update_fields=["revoked_at", "revoked_reason"])
    event_record(session_id=grant.session_id, turn_id=turn_id, step_id=step_id, type="grant.invalidated",
                 payload={**grant_public(grant), "changed": changed, "reason": grant.revoked_reason})


@transaction.atomic
def grant_revoke(*, grant_id: int, actor: User) -> ApprovalGrant:
    """Revoke a grant (any reviewer of the session's team). Idempotent; audited; an event."""
    try:
        grant = locked_with_session(ApprovalGrant.objects.select_related("session"), pk=grant_id)
    except (ApprovalGrant.DoesNotExist, ValueError, ValidationError) as exc:
        raise NotFound(f"No grant {grant_id}") from exc
    if not (actor.is_active and actor.has_perm(DECIDE_APPROVALS)
            and has_team_role(actor, grant.session.team_id, REVIEW_ROLES)):
        raise PermissionDenied("Revoking a grant needs the reviewer role in the session's team.")
    if grant.revoked_at is not None:
        return grant
    grant.revoked_at, grant.revoked_by = timezone.now(), actor
    grant.save(update_fields=["revoked_at", "revoked_by"])
    source = grant.source_request.request_id if grant.source_request else uuid.UUID(int=0)
    ApprovalAudit.objects.create(request_id=source, session_id=grant.session_id, team_id=grant.session.team_id,
                                 action=ApprovalAudit.Action.GRANT_REVOKED, actor=actor,
                                 actor_username=actor.get_username(), details=grant_public(grant))
    event_record(session_id=grant.session_id, type="grant.revoked",
                 payload={**grant_public(grant), "revoked_by": actor.get_username()})
    return grant
