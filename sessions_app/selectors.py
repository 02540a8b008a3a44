"""Reads for sessions, turns, steps, events and artifacts.

Every read of the interfaces (API, pages, consumers, fragments, tasks) comes through here. Each
function runs a fixed number of queries whatever the number of rows: lists paginate, relations
are fetched in bulk.
"""

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from django.conf import settings
from django.contrib.auth.models import User
from django.core.paginator import Page, Paginator
from django.db.models import Count, Exists, Model, OuterRef, Q, QuerySet, Subquery

from agentops.domain import InvalidArguments, NotFound
from agentops.models import Team
from agentops.prepared import Prepared, all_together
from agentops.teams import OPERATE_ROLES, is_active, member_teams, require_team_role, scope
from sessions_app.models import AgentProfile, AgentSession, Artifact, Event, SessionTitle, Step, Turn

M = TypeVar("M", bound=Model)


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def _uuids(values: Iterable[Any]) -> list[uuid.UUID]:
    return [key for key in map(_uuid, values) if key is not None]


def _get(qs: QuerySet[Any], pk: Any, what: str) -> Any:
    try:
        return qs.get(pk=uuid.UUID(str(pk)))
    except (ValueError, qs.model.DoesNotExist) as exc:
        raise NotFound(f"No {what} {pk}") from exc


# --- sessions ------------------------------------------------------------------------------

def session_get(session_id: Any, *, user: Any) -> AgentSession:
    """The session with its agent and owner; NotFound for an unknown or malformed id and for a
    session outside the user's teams."""
    return _get(scope(AgentSession.objects.select_related("agent", "owner"), user), session_id, "session")


def session_to_operate(session_id: Any, *, user: Any) -> AgentSession:
    """A session the user may drive (send input, cancel, submit tool outputs): NotFound outside
    the user's teams, PermissionDenied when their role in its team is reviewer only."""
    session = session_get(session_id, user=user)
    require_team_role(user, session.team_id, OPERATE_ROLES, what="operate its sessions")
    return session


# Every WebSocket and SSE stream asks it when it connects and when it re-checks its access (200
# watchers connecting at once): compiled once (agentops/prepared.py) for a member who is no superuser.
_SESSION_OF_MEMBER = Prepared(lambda pk, user_id: AgentSession.objects.filter(
    pk=pk, team_id__in=member_teams(user_id)).only("pk").order_by()[:1])


def session_exists(session_id: Any, *, user: Any) -> bool:
    """Is there such a session in the user's teams?"""
    key = _uuid(session_id)
    if key is None:
        return False
    if is_active(user) and not user.is_superuser:
        return bool(_SESSION_OF_MEMBER.all(pk=key, user_id=user.pk))
    return scope(AgentSession.objects.filter(pk=key), user).exists()


@dataclass
class LiveRows:
    """The rows the live fragments of an event batch show, by id as text: steps (each with
    ``asked``: was it ever the subject of an approval request), turns (with who created them) and
    sessions (their sidebars)."""

    steps: dict[str, Step]
    turns: dict[str, Turn]
    sessions: dict[str, AgentSession]


def _asked() -> Exists:
    from approvals_app.models import ApprovalRequest  # approvals_app's models import these

    return Exists(ApprovalRequest.objects.filter(step_id=OuterRef("pk")))


# Compiled once (agentops/prepared.py), each one statement whatever the number of ids.
_LIVE_STEPS = Prepared(lambda ids: Step.objects.filter(pk__any=ids).annotate(asked=_asked()).order_by())
_LIVE_TURNS = Prepared(lambda ids: Turn.objects.filter(pk__any=ids).select_related("created_by").order_by())
_LIVE_SESSIONS = Prepared(lambda ids: AgentSession.objects.filter(pk__any=ids).order_by())


def newest_events(limit: int) -> list[dict[str, Any]]:
    """The ``limit`` newest stored events of any session, as announced (``Event.as_dict``),
    oldest first (the announcer warms up on them)."""
    return [e.as_dict() for e in reversed(Event.objects.order_by("-id")[:limit])]


def live_rows(*, step_ids: Iterable[Any] = (), turn_ids: Iterable[Any] = (),
              session_ids: Iterable[Any] = ()) -> LiveRows:
    """The rows behind an event batch's fragments, in one round trip to the database whatever
    their number (``all_together``; values that are not UUIDs dropped). The announcer reads these
    per batch on the live path: three waits on the server there were a third of its rendering."""
    wanted: list[tuple[Prepared[Any], list[uuid.UUID]]] = [
        (_LIVE_STEPS, _uuids(step_ids)), (_LIVE_TURNS, _uuids(turn_ids)), (_LIVE_SESSIONS, _uuids(session_ids))]
    reads = [(prepared, {"ids": ids}) for prepared, ids in wanted if ids]
    rows = iter(all_together(*reads))
    steps, turns, sessions = ({str(row.pk): row for row in next(rows)} if ids else {} for _, ids in wanted)
    return LiveRows(steps=steps, turns=turns, sessions=sessions)


def sessions_list(*, user: Any, status: str | None = None, agent: str | None = None, owner: str | None = None,
                  q: str | None = None, metadata: dict[str, str] | None = None,
                  batch: str | None = None) -> QuerySet[AgentSession]:
    """The sessions of the user's teams, newest first; ``q`` searches titles and turn inputs;
    ``metadata`` matches keys exactly; ``batch`` (an id) keeps that batch's sessions (fanout_app)."""
    qs = scope(AgentSession.objects.select_related("agent", "owner"), user).order_by("-created_at", "-id")
    for key, value in (metadata or {}).items():
        qs = qs.filter(**{f"metadata__{key}": value})
    if status:
        qs = qs.filter(status=status)
    if agent:
        qs = qs.filter(agent__slug=agent)
    if owner:
        qs = qs.filter(owner__username=owner)
    if batch:
        batch_id = _uuid(batch)
        qs = qs.filter(batch_member__batch_id=batch_id) if batch_id else qs.none()
    if q:
        # Two sets of ids, not a correlated EXISTS nor a LIKE per row: PostgreSQL finds the matching
        # titles (a table of their own, SessionTitle) and turns once each through their trigram
        # indexes (migrations 0004, 0009, 0010) and tests each session against both hashed sets, so
        # the newest page stops at its 25th match. (A UNION of the two sets sorted every match
        # before the page: 30 ms for a common word.)
        titles = SessionTitle.objects.filter(title__icontains=q).order_by().values("session_id")
        inputs = Turn.objects.filter(input__icontains=q).order_by().values("session_id")
        qs = qs.filter(Q(pk__in=titles) | Q(pk__in=inputs))
    return qs


def sessions_page(*, user: Any, status: str = "", agent: str = "", owner: str = "", q: str = "",
                  page: int | str = 1, per_page: int = 25, batch: str = "") -> Page[AgentSession]:
    """A page of ``sessions_list``. Two queries (count, page)."""
    return Paginator(sessions_list(user=user, status=status, agent=agent, owner=owner, q=q, batch=batch),
                     per_page).get_page(page)


def session_owners(*, user: Any) -> list[User]:
    """Everyone who owns a session in the user's teams, by username (a filter's choices). One
    query that probes each user's sessions by the owner index until one is in the user's teams: its
    cost follows the number of users, where collecting every session's owner read the whole table
    (10 ms of every list page at 10,000 sessions, proof/scale.py)."""
    # A scalar subquery with LIMIT 1 stays a probe per user; PostgreSQL turns EXISTS (whose LIMIT it
    # drops) into a hash of every session's owner.
    owned = scope(AgentSession.objects.filter(owner_id=OuterRef("pk")), user).order_by().values("pk")[:1]
    return list(User.objects.alias(owns=Subquery(owned)).filter(owns__isnull=False).order_by("username"))


def session_status_counts(*, user: Any) -> dict[str, int]:
    """How many sessions of the user's teams are in each status (every status present, 0 when
    none). One query."""
    counts = dict.fromkeys(AgentSession.Status.values, 0)
    for row in scope(AgentSession.objects.order_by(), user).values("status").annotate(n=Count("id")):
        counts[row["status"]] = row["n"]
    return counts


WAITING_STATUSES = (AgentSession.Status.IN_PROGRESS, AgentSession.Status.AWAITING_APPROVAL,
                    AgentSession.Status.REQUIRES_ACTION)


def sessions_stuck(*, user: Any, now: datetime, quiet_for: timedelta, limit: int = 10) -> list[AgentSession]:
    """Sessions of the user's teams with a turn in flight (running, awaiting approval, requiring
    action) and no event for ``quiet_for``, the quietest first."""
    return list(scope(AgentSession.objects.all(), user)
                .filter(status__in=WAITING_STATUSES, last_event_at__lt=now - quiet_for)
                .select_related("agent").order_by("last_event_at")[:limit])


def steps_blocking(session_ids: list[Any]) -> dict[Any, Step]:
    """Per session, the newest step its active turn waits on (in flight, approved or planned).
    One query; none for no sessions."""
    if not session_ids:
        return {}
    rows = (Step.objects.filter(session_id__in=session_ids, turn__status__in=Turn.ACTIVE,
                                status__in=[Step.Status.RUNNING, Step.Status.AWAITING_APPROVAL,
                                            Step.Status.IN_DOUBT, Step.Status.APPROVED, Step.Status.PLANNED])
            .only("id", "session_id", "kind", "tool_name", "status", "lease_expires_at", "started_at", "created_at")
            .order_by("session_id", "-index"))
    found: dict[Any, Step] = {}
    for step in rows:
        found.setdefault(step.session_id, step)
    return found


def sessions_recent(*, user: Any, limit: int = 8) -> list[AgentSession]:
    """The sessions with the latest events."""
    return list(scope(AgentSession.objects.select_related("agent", "owner"), user)
                .order_by("-last_event_at", "-created_at")[:limit])


# --- agents --------------------------------------------------------------------------------

# Every session start asks it (an API client fanning out hundreds of sessions at once): compiled
# once (agentops/prepared.py), ``scope(…, roles=OPERATE_ROLES)`` for a member who is no superuser.
_AGENT_OF_OPERATOR = Prepared(lambda slug, user_id: AgentProfile.objects.filter(
    slug=slug, team_id__in=member_teams(user_id, roles=OPERATE_ROLES)).order_by("pk")[:2])


def agent_get(slug: str, *, user: Any) -> AgentProfile:
    """An agent of a team where the user operates (the one who starts sessions with it)."""
    if is_active(user) and not user.is_superuser:
        rows = _AGENT_OF_OPERATOR.all(slug=slug, user_id=user.pk)
    else:
        rows = list(scope(AgentProfile.objects.all(), user, roles=OPERATE_ROLES).filter(slug=slug)[:2])
    if len(rows) != 1:  # the slug is unique: never two
        raise NotFound(f"No agent {slug!r}", details={"field": "agent"})
    return rows[0]


def agents_enabled(*, user: Any) -> QuerySet[AgentProfile]:
    return scope(AgentProfile.objects.filter(enabled=True), user).prefetch_related("tools")


def agents_all(*, user: Any) -> list[AgentProfile]:
    """Every agent profile of the user's teams, enabled or not, by name (a filter's choices)."""
    return list(scope(AgentProfile.objects.all(), user).order_by("name"))


def agents_to_start(*, user: Any) -> QuerySet[AgentProfile]:
    """The enabled agents the user may start a session with."""
    return scope(AgentProfile.objects.filter(enabled=True), user, roles=OPERATE_ROLES).order_by("name")


# --- turns and steps -----------------------------------------------------------------------

def turn_get(turn_id: Any, *, user: Any) -> Turn:
    return _get(scope(Turn.objects.select_related("session"), user, field="session__team_id"), turn_id, "turn")


def current_turn_id(session_id: Any) -> uuid.UUID | None:
    """The session's latest turn (the one a turn-scoped grant must belong to). One query."""
    return Turn.objects.filter(session_id=session_id).order_by("-index").values_list("id", flat=True).first()


def turns_of_session(session_id: Any) -> list[Turn]:
    """Every turn of a session, in order."""
    return list(Turn.objects.filter(session_id=session_id).order_by("index"))


def turns_of_session_qs(session_id: Any) -> QuerySet[Turn]:
    """A session's turns (unordered: the caller pages them)."""
    return Turn.objects.filter(session_id=session_id)


def timeline_turns(session_id: Any, *, before: int | None = None, per_page: int = 5) -> tuple[list[Turn], bool]:
    """The last ``per_page`` turns of a session (before turn index ``before``), oldest first, and
    whether earlier turns exist. One query."""
    qs = Turn.objects.filter(session_id=session_id).select_related("created_by")
    if before is not None:
        qs = qs.filter(index__lt=before)
    turns = list(qs.order_by("-index")[:per_page + 1])
    return sorted(turns[:per_page], key=lambda t: t.index), len(turns) > per_page


def turn_steps(turn_id: Any) -> list[Step]:
    return list(Step.objects.filter(turn_id=turn_id).order_by("index"))


def steps_of_turns(turn_ids: Iterable[Any]) -> list[Step]:
    """The steps of these turns, in order within each turn. One query (none for no ids)."""
    keys = list(turn_ids)
    return list(Step.objects.filter(turn_id__in=keys).order_by("index")) if keys else []


# Session notes the timeline shows inside the turn they happened in.
NOTE_TYPES = ("session.pinned_changed", "session.compact_requested")


def notes_of_turns(session_id: Any, turn_ids: Iterable[Any]) -> list[dict[str, Any]]:
    """The notes (``NOTE_TYPES`` events) of these turns, as ``Event.as_dict()``. One query."""
    keys = list(turn_ids)
    if not keys:
        return []
    return [e.as_dict() for e in Event.objects.filter(session_id=session_id, type__in=NOTE_TYPES,
                                                      turn_id__in=keys).order_by("seq")]


class Streamed(NamedTuple):
    """What a running step has streamed so far: text, the seq of its last event, and (a command)
    its last structured progress."""

    text: str
    seq: int
    progress: dict[str, Any] | None = None


STREAM_TYPES = ("model.delta", "tool.progress")


def streamed_texts(session_id: Any, step_ids: Iterable[Any]) -> dict[Any, Streamed]:
    """For running steps: the text streamed so far (a model call's ``model.delta`` events, a
    command's ``tool.progress`` output) and the seq of the last one, by step id. One query (none
    for no steps)."""
    keys = list(step_ids)
    if not keys:
        return {}
    rows = (Event.objects.filter(session_id=session_id, step_id__in=keys, type__in=STREAM_TYPES,
                                 step__status=Step.Status.RUNNING)
            .order_by("seq").values_list("step_id", "seq", "type", "payload"))
    texts: dict[Any, list[str]] = {}
    last_seq: dict[Any, int] = {}
    progress: dict[Any, dict[str, Any]] = {}
    for step_id, seq, type_, payload in rows:
        payload = payload or {}
        parts = texts.setdefault(step_id, [])
        if type_ == "model.delta":
            parts.append(str(payload.get("text", "")))
        else:
            parts.append(str(payload.get("stdout", "")) + str(payload.get("stderr", "")))
            if isinstance(payload.get("progress"), dict):
                progress[step_id] = payload["progress"]
        last_seq[step_id] = seq
    return {step_id: Streamed("".join(parts), last_seq[step_id], progress.get(step_id))
            for step_id, parts in texts.items()}


def turn_id_of_step(step_id: Any) -> uuid.UUID | None:
    """The turn a step belongs to, or None for an unknown step."""
    key = _uuid(step_id)
    if key is None:
        return None
    return Step.objects.filter(pk=key).values_list("turn_id", flat=True).first()


def steps_still_held(held: dict[uuid.UUID, str]) -> set[uuid.UUID]:
    """Of ``held`` (step id → lease owner), the steps still running under that owner's lease: a
    step cancelled, expired and re-issued, or settled meanwhile is not among them."""
    if not held:
        return set()
    rows = Step.objects.filter(pk__in=list(held), status=Step.Status.RUNNING,
                               lease_owner__in=set(held.values())).values_list("pk", "lease_owner")
    return {pk for pk, owner in rows if held.get(pk) == owner}


# --- events --------------------------------------------------------------------------------

SEQ_MAX = 2**63 - 1
PREPARED_LIMITS = 8  # the few page sizes the streams and the API ask for; any other is built as usual


def _events_between(*, session_id: Any, after: int, until: int, limit: int) -> QuerySet[Event]:
    return Event.objects.filter(session_id=session_id, seq__gt=after, seq__lte=until).order_by("seq")[:limit]


# Every WebSocket's backlog and resend and every SSE page reads it (200 watchers connecting at
# once): compiled once per page size (agentops/prepared.py).
_EVENTS_AFTER: dict[int, Prepared[Event]] = {}


def events_after(*, session_id: Any, after: int = 0, limit: int = 200, until: int | None = None) -> list[Event]:
    """A session's events with ``after < seq <= until``, in seq order, at most ``limit``."""
    prepared = _EVENTS_AFTER.get(limit)
    if prepared is None and len(_EVENTS_AFTER) < PREPARED_LIMITS:
        prepared = _EVENTS_AFTER.setdefault(limit, Prepared(partial(_events_between, limit=limit)))
    upper = SEQ_MAX if until is None else until
    if prepared is not None:
        return prepared.all(session_id=_uuid(session_id), after=after, until=upper)
    return list(_events_between(session_id=session_id, after=after, until=upper, limit=limit))


def events_since(*, user: Any, type_prefix: str, since: datetime, limit: int,
                 after: tuple[datetime, int] | None = None) -> list[Event]:
    """Events of every session whose type starts with ``type_prefix``, stamped at or after
    ``since``, oldest first (by ``created_at``, then ``id``), at most ``limit``; the next page
    starts ``after`` the (created_at, id) of the last event of the previous one."""
    qs = scope(Event.objects.filter(type__startswith=type_prefix, created_at__gte=since), user,
               field="session__team_id")
    if after is not None:
        qs = qs.filter(Q(created_at__gt=after[0]) | Q(created_at=after[0], id__gt=after[1]))
    return list(qs.order_by("created_at", "id")[:limit])


# --- artifacts -----------------------------------------------------------------------------

def artifact_get(artifact_id: Any, *, user: Any) -> Artifact:
    return _get(scope(Artifact.objects.select_related("session"), user, field="session__team_id"), artifact_id,
                "artifact")


def artifacts_of_session(session_id: Any, *, newest_first: bool = False, limit: int | None = None) -> list[Artifact]:
    qs = Artifact.objects.filter(session_id=session_id).order_by("-created_at" if newest_first else "created_at")
    return list(qs[:limit] if limit is not None else qs)


@dataclass(frozen=True)
class ArtifactFile:
    artifact: Artifact
    path: Path  # resolved, inside the artifact root, a regular file


def artifact_file_get(*, artifact_id: Any, user: Any, session_id: Any = None) -> ArtifactFile:
    """An artifact (of ``session_id`` when given) and its stored file.

    NotFound for an unknown artifact, and for a file that is missing or resolves outside
    AGENTOPS_ARTIFACT_ROOT (a row pointing elsewhere must not serve the server's files).
    """
    qs = scope(Artifact.objects.all(), user, field="session__team_id")
    if session_id is not None:
        qs = qs.filter(session_id=_uuid(session_id))
    artifact: Artifact = _get(qs, artifact_id, "artifact")
    root = Path(settings.AGENTOPS_ARTIFACT_ROOT).resolve()
    path = (root / artifact.storage_path).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise NotFound("The artifact's content is missing from storage.")
    return ArtifactFile(artifact=artifact, path=path)


def session_started_with_key(*, user: Any, key: str) -> AgentSession | None:
    """The session ``user`` started with ``key`` as its first turn's Idempotency-Key, if any."""
    turn = (Turn.objects.filter(index=1, created_by_id=getattr(user, "pk", None), idempotency_key=key)
            .select_related("session").order_by("created_at").first())
    return turn.session if turn is not None else None


def stream_seen(session_id: Any, until_seq: int) -> tuple[set[str], dict[str, Any]]:
    """Of the session's active turns, up to ``until_seq``: the model steps that streamed text
    (``model.delta``) and the tool steps' arguments (``tool.started``). One query."""
    announced: set[str] = set()
    arguments: dict[str, Any] = {}
    rows = (Event.objects.filter(session_id=session_id, seq__lte=until_seq, type__in=("model.delta", "tool.started"),
                                 turn__status__in=Turn.ACTIVE, step_id__isnull=False)
            .values_list("type", "step_id", "payload"))
    for type_, step_id, payload in rows:
        if type_ == "model.delta":
            announced.add(str(step_id))
        else:
            arguments[str(step_id)] = (payload or {}).get("arguments")
    return announced, arguments


def client_steps_waiting(session_id: Any) -> list[Step]:
    """Tool steps of the session's active turn that wait for the integration's output: running
    with no lease (a leased running step is a command a worker runs). In order."""
    return client_steps_waiting_of([session_id])


def client_steps_waiting_of(session_ids: Iterable[Any]) -> list[Step]:
    """``client_steps_waiting`` of several sessions, one query (none for no ids)."""
    keys = list(session_ids)
    if not keys:
        return []
    return list(Step.objects.filter(session_id__in=keys, kind=Step.Kind.TOOL, status=Step.Status.RUNNING,
                                    lease_expires_at__isnull=True, turn__status__in=Turn.ACTIVE)
                .order_by("turn__index", "index"))


def turn_of_session(*, session_id: Any, turn_id: Any) -> Turn:
    """A turn of this session; NotFound for another session's turn or an unknown id."""
    return _get(Turn.objects.filter(session_id=session_id).select_related("session__agent"), turn_id, "turn")


def turn_last_failed(session_id: Any) -> Turn | None:
    return Turn.objects.filter(session_id=session_id, status=Turn.Status.FAILED).order_by("-index").first()


def team_for_new_agent(*, user: Any, team: str | None = None) -> int:
    """The team an agent created by ``user`` through an integration belongs to: the one named
    (a team where the user operates), else the user's only such team. InvalidArguments when the
    user operates in several and named none, or in none."""
    teams = scope(Team.objects.all(), user, field="id", roles=OPERATE_ROLES).order_by("slug")
    if team:
        found = teams.filter(slug=team).values_list("id", flat=True).first()
        if found is None:
            raise NotFound(f"No team {team!r} where you operate", details={"field": "metadata.agentops_team"})
        return found
    ids = list(teams.values_list("id", flat=True)[:2])
    if len(ids) != 1:
        raise InvalidArguments("You operate in several teams (or none): name the agent's team with "
                               "metadata.agentops_team = '<team slug>'.", details={"field": "metadata.agentops_team"})
    return ids[0]


def agent_get_enabled(slug: str, *, user: Any) -> AgentProfile:
    """An enabled agent profile of the user's teams (a retired one is gone for the integrations)."""
    try:
        return scope(AgentProfile.objects.prefetch_related("tools"), user).get(slug=slug, enabled=True)
    except AgentProfile.DoesNotExist as exc:
        raise NotFound(f"No agent {slug!r}", details={"field": "agent_id"}) from exc


def artifact_of_session(*, session_id: Any, artifact_id: Any) -> Artifact:
    return _get(Artifact.objects.filter(session_id=session_id), artifact_id, "artifact")


def artifacts_of_session_qs(session_id: Any) -> QuerySet[Artifact]:
    return Artifact.objects.filter(session_id=session_id)
