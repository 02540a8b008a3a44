"""Generate a large dataset fast: sessions, turns, steps, events and pending approvals.

Everything is generated inside PostgreSQL with ``INSERT … SELECT generate_series`` (no rows
travel through Python), in one transaction, then ANALYZEd. The shape follows what the engine
writes: turn index from 1, steps (model, tool) per turn, events gap-free per session with
``last_seq`` matching, one pending approval (with its awaiting turn and step) per waiting session.

One session is *heavy* (many turns and events): the session page and the events API are measured
on it, where paging matters.
"""

from typing import Any

from django.contrib.auth.models import Group, User
from django.db import connection, transaction

from agentops.models import Team, TeamMembership, TeamRole
from proof.scale import Size
from sessions_app.models import AgentProfile

TEAM = "scale"

WORDS = ["deploy", "invoice", "migrate", "report", "backup", "refactor", "billing", "onboarding",
         "release", "audit", "cleanup", "dashboard", "pipeline", "schema", "search", "upgrade"]
TOOLS = ["send_email", "write_file", "run_command", "http_request"]
EVENT_TYPES = ["turn.started", "model.completed", "tool.started", "tool.completed", "model.delta"]


def scale_team() -> Team:
    """The team everything generated belongs to (its viewers must be members to see it)."""
    return Team.objects.get_or_create(slug=TEAM, defaults={"name": "Scale"})[0]


def _people(size: Size) -> tuple[int, list[int], list[int]]:
    """The team, owners (operators and reviewers, members of it) and agents, by id."""
    team = scale_team()
    groups = list(Group.objects.filter(name__in=["operators", "reviewers"]))
    owners = []
    for n in range(size.owners):
        user, created = User.objects.get_or_create(username=f"scale-owner-{n}")
        if created:
            user.set_unusable_password()
            user.save(update_fields=["password"])
            user.groups.add(*groups)
        TeamMembership.objects.get_or_create(team=team, user=user, defaults={"role": TeamRole.BOTH})
        owners.append(user.pk)
    agents = [AgentProfile.objects.update_or_create(slug=f"scale-agent-{n}",
                                                    defaults={"name": f"Scale agent {n}", "model": "scripted",
                                                              "team": team})[0].pk
              for n in range(size.agents)]
    return team.pk, owners, agents


def generate(size: Size) -> dict[str, int]:
    """Fill the (empty) database; returns the row counts written."""
    if size.pending >= size.sessions:
        raise ValueError("pending approvals need a session each, and the heavy one has none")
    team, owners, agents = _people(size)
    per_session = (size.events - size.heavy_events) // (size.sessions - 1)
    extra = (size.events - size.heavy_events) - per_session * (size.sessions - 1)
    params: dict[str, Any] = {"team": team, "owners": owners, "agents": agents, "words": WORDS, "tools": TOOLS,
              "types": EVENT_TYPES, "sessions": size.sessions, "pending": size.pending, "per_session": per_session,
              "extra": extra,
              "heavy_events": size.heavy_events, "heavy_turns": size.heavy_turns, "tps": size.turns_per_session}
    with transaction.atomic(), connection.cursor() as cur:
        # n = 1 is the heavy session; n = 2 .. pending + 1 wait for a reviewer; the rest are idle,
        # failed or in progress. Session n gets per_session events (+1 for the first `extra`).
        cur.execute("""
            CREATE TEMP TABLE gen_session ON COMMIT DROP AS
            SELECT n, gen_random_uuid() AS id,
                   CASE WHEN n = 1 THEN %(heavy_turns)s ELSE %(tps)s END AS turns,
                   CASE WHEN n = 1 THEN %(heavy_events)s
                        ELSE %(per_session)s + CASE WHEN n - 1 <= %(extra)s THEN 1 ELSE 0 END END AS events,
                   CASE WHEN n = 1 THEN 'idle'
                        WHEN n <= %(pending)s + 1 THEN 'awaiting_approval'
                        WHEN n %% 10 = 0 THEN 'failed'
                        WHEN n %% 10 = 1 THEN 'in_progress'
                        ELSE 'idle' END AS status,
                   (%(owners)s::int[])[1 + n %% cardinality(%(owners)s::int[])] AS owner_id,
                   (%(agents)s::bigint[])[1 + (n / 7) %% cardinality(%(agents)s::bigint[])] AS agent_id,
                   now() - (%(sessions)s - n) * interval '1 minute' AS created_at
            FROM generate_series(1, %(sessions)s) AS n""", params)
        cur.execute("""
            INSERT INTO sessions_app_agentsession
                (id, title, status, requirements, prohibitions, acceptance_criteria, metadata, tool_calls,
                 model_calls, prompt_tokens, completion_tokens, wall_seconds, workspace, last_seq,
                 last_event_at, created_at, updated_at, agent_id, owner_id, team_id, pinned_revision,
                 compact_requested, criteria_unmet)
            SELECT id, initcap((%(words)s::text[])[1 + n %% 16]) || ' ' || (%(words)s::text[])[1 + (n / 16) %% 16]
                       || ' #' || n,
                   status, '[]', '[]', '[]', '{}', turns, turns * 2, turns * 900, turns * 120, turns * 3.5, '',
                   events, created_at + events * interval '10 ms', created_at, created_at, agent_id, owner_id,
                   %(team)s, 0, false, false
            FROM gen_session""", params)
        cur.execute("""
            INSERT INTO sessions_app_sessiontitle (session_id, title)
            SELECT s.id, s.title FROM sessions_app_agentsession s JOIN gen_session g ON g.id = s.id""")
        cur.execute("""
            CREATE TEMP TABLE gen_turn ON COMMIT DROP AS
            SELECT s.n, s.id AS session_id, gen_random_uuid() AS id, i AS index, s.turns,
                   CASE WHEN i < s.turns THEN 'completed'
                        WHEN s.status = 'awaiting_approval' THEN 'awaiting_approval'
                        WHEN s.status = 'in_progress' THEN 'running'
                        WHEN s.status = 'failed' THEN 'failed'
                        ELSE 'completed' END AS status,
                   s.owner_id, s.created_at + i * interval '1 second' AS created_at
            FROM gen_session s, generate_series(1, s.turns) AS i""", params)
        cur.execute("""
            INSERT INTO sessions_app_turn
                (id, index, input, status, output_text, error_code, error_message, retryable, prompt_tokens,
                 completion_tokens, idempotency_key, created_at, started_at, finished_at, updated_at,
                 created_by_id, session_id, criteria_unmet)
            SELECT id, index,
                   'Please ' || (%(words)s::text[])[1 + (n + index) %% 16] || ' the ' ||
                       (%(words)s::text[])[1 + (n * 3 + index) %% 16] || ' (ticket T' || n || '-' || index || ')',
                   status, CASE WHEN status = 'completed' THEN 'Done.' ELSE '' END,
                   CASE WHEN status = 'failed' THEN 'tool_failed' ELSE '' END, '', false, 900, 120, '',
                   created_at, created_at, CASE WHEN status IN ('completed', 'failed') THEN created_at END,
                   created_at, owner_id, session_id, false
            FROM gen_turn""", params)
        # Two steps per turn: the model call, then the tool it asked for.
        cur.execute("""
            INSERT INTO sessions_app_step
                (id, index, kind, status, tool_name, call_id, arguments, approval_mode, message, prompt_tokens,
                 completion_tokens, result, error_code, error_message, attempts, idempotency_key, lease_owner,
                 created_at, started_at, finished_at, updated_at, session_id, turn_id)
            SELECT gen_random_uuid(), k, CASE WHEN k = 0 THEN 'model' ELSE 'tool' END,
                   CASE WHEN k = 1 AND t.status = 'awaiting_approval' THEN 'awaiting_approval'
                        WHEN k = 1 AND t.status = 'running' THEN 'running'
                        ELSE 'completed' END,
                   CASE WHEN k = 1 THEN (%(tools)s::text[])[1 + (t.n + t.index) %% 4] ELSE '' END,
                   CASE WHEN k = 1 THEN 'call_' || t.n || '_' || t.index ELSE '' END,
                   CASE WHEN k = 1 THEN jsonb_build_object('to', 'ops@example.com', 'subject', 'Report ' || t.n)
                        ELSE '{}'::jsonb END,
                   CASE WHEN k = 1 THEN 'mutating' ELSE '' END,
                   CASE WHEN k = 0 THEN jsonb_build_object('role', 'assistant', 'content', 'Working on it.')
                        ELSE '{}'::jsonb END,
                   CASE WHEN k = 0 THEN 900 ELSE 0 END, CASE WHEN k = 0 THEN 120 ELSE 0 END,
                   CASE WHEN k = 1 AND t.status NOT IN ('awaiting_approval', 'running')
                        THEN '{"ok": true}'::jsonb END,
                   '', '', 1, '', '', t.created_at, t.created_at, t.created_at, t.created_at, t.session_id, t.id
            FROM gen_turn t, generate_series(0, 1) AS k""", params)
        # Events: seq 1..events per session, spread evenly over its turns.
        cur.execute("""
            INSERT INTO sessions_app_event (session_id, seq, type, payload, created_at, turn_id)
            SELECT s.id, seq, (%(types)s::text[])[1 + seq %% 5],
                   jsonb_build_object('text', 'event ' || seq || ' of session ' || s.n),
                   s.created_at + seq * interval '10 ms', t.id
            FROM gen_session s
            CROSS JOIN LATERAL generate_series(1, s.events) AS seq
            JOIN gen_turn t ON t.session_id = s.id AND t.index = 1 + ((seq - 1) * s.turns) / s.events""", params)
        cur.execute("""
            INSERT INTO approvals_app_approvalrequest
                (request_id, kind, tool_name, arguments, arguments_sha256, approval_mode, risk, risk_note,
                 sandbox_backend, network_policy, preview, status, decision, reason, seen_sha256, remember,
                 created_at, updated_at, session_id, step_id, turn_id, team_id, run_spec, approved_sha256,
                 omit_arguments, policy_reason, priority, required_approvals)
            SELECT gen_random_uuid(), 'tool', st.tool_name, st.arguments, md5(st.id::text) || md5(st.id::text),
                   'mutating', (ARRAY['low', 'medium', 'high'])[1 + t.n %% 3], '', 'bubblewrap', 'none', '',
                   'pending', '', '', '', false, t.created_at, t.created_at, t.session_id, st.id, t.id,
                   %(team)s, '{}'::jsonb, '', false, '', 0, 1
            FROM gen_turn t JOIN sessions_app_step st ON st.turn_id = t.id AND st.index = 1
            WHERE t.status = 'awaiting_approval'""", params)
        # ON COMMIT DROP is not enough inside an outer transaction (a test's): a second call needs them gone.
        cur.execute("DROP TABLE gen_turn, gen_session")
    with connection.cursor() as cur:
        for table in ("sessions_app_agentsession", "sessions_app_turn", "sessions_app_step", "sessions_app_event",
                      "approvals_app_approvalrequest"):
            cur.execute(f"ANALYZE {table}")
    return counts()


def counts() -> dict[str, int]:
    out = {}
    with connection.cursor() as cur:
        for name, sql in [
            ("sessions", "SELECT count(*) FROM sessions_app_agentsession"),
            ("turns", "SELECT count(*) FROM sessions_app_turn"),
            ("steps", "SELECT count(*) FROM sessions_app_step"),
            ("events", "SELECT count(*) FROM sessions_app_event"),
            ("pending approvals", "SELECT count(*) FROM approvals_app_approvalrequest WHERE status = 'pending'"),
        ]:
            cur.execute(sql)
            out[name] = cur.fetchone()[0]
    return out
