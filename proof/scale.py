"""Pages and API at scale (issue 13, point 4).

A database of its own gets 10,000 sessions, 1,000,000 events and 5,000 pending approvals (short
form: 2,000 / 200,000 / 1,000), generated inside PostgreSQL (``scale_data.py``). Then every page
and list endpoint an operator or reviewer uses is requested through Django's full request stack
(middleware, auth, views, templates; the in-process test client, so the time is the server's),
and the p95 of each is checked against 100 ms. The floor, measured in the same run, is the
cheapest authenticated API read (one session by id): each view's ratio to it is what the view
costs beyond the stack itself.

    python -m proof.scale [--full] [--keep]
"""

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from proof._common import (
    Result,
    database_url,
    django_setup,
    drop_database,
    machine,
    percentile,
    print_table,
    print_verdicts,
    recreate_database,
    timing_asserted,
)

TARGET_P95_MS = 100.0


@dataclass(frozen=True)
class Size:
    sessions: int
    events: int
    pending: int
    heavy_events: int
    heavy_turns: int
    turns_per_session: int = 3
    owners: int = 20
    agents: int = 6


FULL = Size(sessions=10_000, events=1_000_000, pending=5_000, heavy_events=50_000, heavy_turns=1_000)
SHORT = Size(sessions=2_000, events=200_000, pending=1_000, heavy_events=20_000, heavy_turns=400)


@dataclass(frozen=True)
class Probe:
    name: str
    path: str
    api: bool = False


def probes(ids: dict[str, str]) -> list[Probe]:
    heavy, small, cursor = ids["heavy"], ids["small"], ids["cursor"]
    before = ids["heavy_before"]
    return [
        Probe("floor: API one session by id", f"/api/sessions/{small}", api=True),
        Probe("overview", "/"),
        Probe("session list", "/sessions/"),
        Probe("session list, status+agent filter", "/sessions/?status=failed&agent=scale-agent-2"),
        Probe("session list, owner filter, page 20", "/sessions/?owner=scale-owner-3&page=20"),
        Probe("session list, search (common word)", "/sessions/?q=invoice"),
        Probe("session list, search (one ticket)", "/sessions/?q=T4242-2"),
        Probe("session list, search (no match)", "/sessions/?q=zzqqxx"),
        Probe("session page (heavy: newest turns)", f"/sessions/{heavy}/"),
        Probe("session page (heavy: older, scrolled)", f"/sessions/{heavy}/timeline/?before={before}"),
        Probe("session page (typical)", f"/sessions/{small}/"),
        Probe("approval queue (oldest first)", "/approvals/"),
        Probe("approval queue (newest, tool filter)", "/approvals/?order=newest&tool=send_email"),
        Probe("API sessions", "/api/sessions", api=True),
        Probe("API sessions, status filter", "/api/sessions?status=awaiting_approval", api=True),
        Probe("API sessions, next page (cursor)", f"/api/sessions?cursor={cursor}", api=True),
        Probe("API sessions, search", "/api/sessions?q=invoice", api=True),
        Probe("API approvals, pending", "/api/approvals?status=pending", api=True),
        Probe("API events (heavy, from start)", f"/api/sessions/{heavy}/events", api=True),
        Probe("API events (heavy, newest)", f"/api/sessions/{heavy}/events?after={ids['heavy_tail']}", api=True),
    ]


def clients() -> tuple[object, dict[str, str]]:
    """A logged-in browser client (operator and reviewer) and the API's Bearer header."""
    from django.contrib.auth.models import Group, User
    from django.test import Client

    from agentops.models import TeamMembership, TeamRole
    from agentops.services import api_token_create
    from proof.scale_data import scale_team

    user, _ = User.objects.get_or_create(username="scale-viewer")
    user.groups.add(*Group.objects.filter(name__in=["operators", "reviewers"]))
    TeamMembership.objects.get_or_create(team=scale_team(), user=user, defaults={"role": TeamRole.BOTH})
    client = Client()
    client.force_login(user)
    token = api_token_create(username=user.username)[1]
    return client, {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def probe_ids() -> dict[str, str]:
    from django.test import Client  # noqa: F401  (Django is set up)

    from sessions_app.models import AgentSession, Turn

    heavy = AgentSession.objects.order_by("-last_seq").first()
    small = AgentSession.objects.order_by("last_seq", "id").first()
    assert heavy is not None and small is not None
    turns = Turn.objects.filter(session=heavy).count()
    from agentops.pagination import cursor_encode

    # The end of the first page (limit 50), or the middle of a smaller table.
    page_end = AgentSession.objects.order_by("-created_at", "-pk")[min(49, AgentSession.objects.count() // 2)]
    return {"heavy": str(heavy.id), "small": str(small.id), "heavy_before": str(turns // 2),
            "heavy_tail": str(max(0, heavy.last_seq - 200)), "cursor": cursor_encode(page_end)}


def measure(requests: dict[str, Callable[[], object]], runs: int) -> dict[str, tuple[list[float], int]]:
    """Times of ``runs`` rounds and the queries of one request, per view. Each round requests every
    view once (after 3 rounds not counted), so a busy moment of a shared machine lands on every
    view alike instead of on whichever was measured then."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    queries = {}
    for name, request in requests.items():
        for _ in range(3):
            request()
        with CaptureQueriesContext(connection) as ctx:
            request()
        queries[name] = len(ctx.captured_queries)  # now: the next request clears the log
    times: dict[str, list[float]] = {name: [] for name in requests}
    for _ in range(runs):
        for name, request in requests.items():
            start = time.perf_counter()
            request()
            times[name].append((time.perf_counter() - start) * 1000)
    return {name: (times[name], queries[name]) for name in requests}


def run(full: bool = False, keep: bool = False, reuse: bool = False) -> Result:
    size = FULL if full else SHORT
    url = database_url(os.environ.get("PROOF_SCALE_DATABASE", "agentops_proof_scale"))
    result = Result("scale", strict_timing=timing_asserted(full))
    print(f"pages and API at scale ({'full' if full else 'short'} size)")
    print(f"  machine    {machine()}")
    print(f"  database   {url} (created for this proof{', kept' if keep else ', dropped at the end'})")
    if not reuse:
        recreate_database(url)
    try:
        django_setup(url)
        from django.core.management import call_command

        from proof import scale_data

        call_command("migrate", verbosity=0)
        if reuse:
            print("  reused    " + ", ".join(f"{v:,} {k}" for k, v in scale_data.counts().items()))
        else:
            start = time.perf_counter()
            written = scale_data.generate(size)
            took = time.perf_counter() - start
            print("  generated  " + ", ".join(f"{v:,} {k}" for k, v in written.items()) + f" in {took:.1f} s")
        runs = 60 if full else 15
        print(f"  method     Django's full stack in process (test client); {runs} rounds, each requesting every "
              "view once, after 3 warm-ups; p95 nearest-rank")
        client, api_headers = clients()

        def requester(probe: Probe) -> Callable[[], object]:
            def request() -> object:
                response = client.get(probe.path, **(api_headers if probe.api else {}))  # type: ignore[attr-defined]
                if response.status_code != 200:
                    raise SystemExit(f"{probe.path}: HTTP {response.status_code}")
                return response

            return request

        measured = measure({probe.name: requester(probe) for probe in probes(probe_ids())}, runs)
        rows = []
        floor_p95 = None
        for name, (times, queries) in measured.items():
            p50, p95 = percentile(times, 50), percentile(times, 95)
            floor_p95 = floor_p95 or p95
            rows.append([name, queries, f"{p50:.1f}", f"{p95:.1f}", f"{max(times):.1f}",
                         f"{p95 / floor_p95:.1f}x", "ok" if p95 <= TARGET_P95_MS else "OVER"])
            if not name.startswith("floor"):
                result.check(f"{name}: p95 ≤ {TARGET_P95_MS:.0f} ms",
                             f"{p95:.1f} ms ({p95 / TARGET_P95_MS:.2f}x the target)", p95 <= TARGET_P95_MS,
                             timing=True)
        result.check("every view answered HTTP 200 at this size", f"{len(measured)} views × {runs} rounds", True)
        print()
        print_table(["view", "queries", "p50 ms", "p95 ms", "max ms", "p95/floor", "≤100ms"], rows)
        print()
        print_verdicts(result)
    finally:
        from django.db import connections

        connections.close_all()
        if not keep:
            drop_database(url)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="10,000 sessions, 1,000,000 events, 5,000 approvals")
    parser.add_argument("--keep", action="store_true", help="keep the database (to explain a slow view)")
    parser.add_argument("--reuse", action="store_true", help="measure a database kept by --keep (implies --keep)")
    args = parser.parse_args()
    raise SystemExit(0 if run(full=args.full, keep=args.keep or args.reuse, reuse=args.reuse).ok else 1)


if __name__ == "__main__":
    main()
