"""The pages and list endpoints of the scale proof run as many queries on more data (issue 13)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from proof.scale import Size, clients, probe_ids, probes
from proof.scale_data import generate

# Small enough to be cheap, large enough that every filter of the probes matches something.
SMALL = Size(sessions=24, events=240, pending=4, heavy_events=60, heavy_turns=12, owners=4, agents=3)
LARGER = Size(sessions=80, events=3_000, pending=40, heavy_events=1_000, heavy_turns=90, owners=6, agents=4)


def _query_counts() -> dict[str, int]:
    """Each probe's queries, the second time it is requested (the first may write the token's use)."""
    client, api_headers = clients()
    counts = {}
    for probe in probes(probe_ids()):
        headers = api_headers if probe.api else {}
        assert client.get(probe.path, **headers).status_code == 200, probe.path  # type: ignore[attr-defined]
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(probe.path, **headers)  # type: ignore[attr-defined]
        assert response.status_code == 200, probe.path
        counts[probe.name] = len(ctx.captured_queries)
    return counts


@pytest.mark.postgres
@pytest.mark.django_db
def test_scale_views_query_count_does_not_grow_with_the_data() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the scale generator writes with PostgreSQL's generate_series")
    generate(SMALL)  # 4 pending: every approval probe has a page to show (an empty one skips a query)
    small = _query_counts()
    generate(LARGER)  # on top: 104 sessions, 3,240 events, 44 pending approvals, a heavier session
    larger = _query_counts()
    assert larger == small
    assert all(n > 0 for n in small.values())


@pytest.mark.postgres
@pytest.mark.django_db
def test_scale_generator_writes_gap_free_events_and_one_pending_approval_per_waiting_session() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the scale generator writes with PostgreSQL's generate_series")
    written = generate(SMALL)
    assert written["sessions"] == 24 and written["events"] == 240 and written["pending approvals"] == 4
    with connection.cursor() as cur:
        cur.execute("""SELECT count(*) FROM sessions_app_agentsession s
                       WHERE s.last_seq <> (SELECT count(*) FROM sessions_app_event e WHERE e.session_id = s.id)
                          OR s.last_seq <> (SELECT coalesce(max(seq), 0) FROM sessions_app_event e
                                            WHERE e.session_id = s.id)""")
        assert cur.fetchone()[0] == 0
        cur.execute("""SELECT count(*) FROM approvals_app_approvalrequest a
                       JOIN sessions_app_step st ON st.id = a.step_id
                       JOIN sessions_app_agentsession s ON s.id = a.session_id
                       WHERE a.status = 'pending' AND st.status = 'awaiting_approval'
                         AND s.status = 'awaiting_approval'""")
        assert cur.fetchone()[0] == 4
