"""The OpenAI Agents API wire (/openai/v1, driven by the official openai SDK) vs agentops's own API,
on the same turn: one client tool call, then the final answer.

    .venv/bin/python bench/openai_wire.py [turns]        # default 30 of each; ~1 min

Runs ``make run``'s layout (``python -m agentops.run``: SQLite, an embedded Redis, daphne, a
worker, a gateway) with the scripted model as a process of its own. Two idle sessions of one agent
(made through the wire, so its tool is a client tool); turns alternate between the two paths, one
at a time:

- wire: ``client.beta.agents.sessions.stream(sid, input=…, tool_handlers=…)`` then
  ``get_final_result()``: GET the session, open GET …/events, POST the input; the SDK runs the
  tool on ``turn.item.added`` and POSTs its result; the helper returns at ``agent.session.idle``.
- own: open ``GET /api/sessions/{id}/events/stream?after=<last seq>``, ``POST /api/sessions/{id}/turns``,
  answer ``tool.started`` (client) with ``POST …/tool-outputs``, stop at the session's idle.

Each clock runs from the first request of the turn (both read the session, then open the event
stream, then post the input) to the idle event. Prints p50/p95 of each and the ratio wire / own.
"""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _stack
import httpx
from _harness import pct

SEED = """
from bench._seed import seed
token = seed()
from django.contrib.auth.models import Permission, User
User.objects.get(username="bench-owner").user_permissions.add(*Permission.objects.filter(
    content_type__app_label="sessions_app", codename__in=["add_agentprofile"]))
print(token)
"""


def get_weather(city: str) -> str:
    """Get the weather for a city."""
    return f"sunny in {city}"


def script(city: str) -> str:
    return f'tool get_weather {json.dumps({"city": city})}\nsay {{results}}'


def own_turn(api: httpx.Client, session_id: str, city: str) -> float:
    start = time.perf_counter()
    after = api.get(f"/sessions/{session_id}").json()["last_seq"]
    with api.stream("GET", f"/sessions/{session_id}/events/stream", params={"after": after}) as events:
        lines = events.iter_lines()
        assert api.post(f"/sessions/{session_id}/turns", json={"input": script(city)}).status_code == 201
        done = False
        for line in lines:
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            payload = event["payload"]
            if event["type"] == "tool.started" and payload.get("client"):
                reply = api.post(f"/sessions/{session_id}/tool-outputs",
                                 json={"call_id": payload["call_id"], "output": get_weather(**payload["arguments"])})
                assert reply.status_code == 200, reply.text
            elif event["type"] == "turn.completed":
                assert f"sunny in {city}" in payload["output_text"]
                done = True
            elif event["type"] == "session.status_changed" and payload["status"] == "idle" and done:
                return time.perf_counter() - start
    raise RuntimeError("the event stream ended before the session was idle")


def main() -> None:
    from openai import OpenAI
    from openai.lib.beta.agents import function_tool

    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    sqlite = Path(tempfile.mkdtemp(prefix="agentops-bench-wire-")) / "bench.sqlite3"
    workspaces = tempfile.mkdtemp(prefix="agentops-bench-wire-ws-")
    stack = _stack.start("make-run", database_url=f"sqlite:///{sqlite}", redis_url="", workspaces=workspaces)
    try:
        env = dict(stack.env, PASSWORD="bench-pass", MODEL_URL=stack.model_url, PYTHONPATH=str(_stack.ROOT),
                   DJANGO_SETTINGS_MODULE="agentops.settings")
        out = subprocess.run([sys.executable, "-c", "import django; django.setup()\n" + SEED], cwd=_stack.ROOT,
                             env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"seeding failed:\n{out.stderr[-3000:]}")
        token = out.stdout.strip().splitlines()[-1]
        tool = function_tool(get_weather)
        client = OpenAI(base_url=f"{stack.url}/openai/v1", api_key=token)
        api = httpx.Client(base_url=f"{stack.url}/api", headers={"Authorization": f"Bearer {token}"}, timeout=60)
        agent = client.beta.agents.create(model="scripted", tools=[tool.definition])
        wire_session = client.beta.agents.sessions.create(environment={"type": "none"}, agent_id=agent.id).id
        own_session = api.post("/sessions", json={"agent": agent.id}).json()["id"]
        wire, own = [], []
        for i in range(turns + 2):  # the first two of each warm up
            city = f"City{i}"
            start = time.perf_counter()
            with client.beta.agents.sessions.stream(wire_session, input=script(city),
                                                    tool_handlers={"get_weather": tool}) as live:
                assert f"sunny in {city}" in live.get_final_result().output_text
            elapsed = time.perf_counter() - start
            own_elapsed = own_turn(api, own_session, city)
            if i >= 2:
                wire.append(elapsed)
                own.append(own_elapsed)
        stack.check()
        print(f"turns: {turns} of each (one client tool call + the answer), interleaved, make-run layout")
        for name, samples in (("wire (openai SDK)", wire), ("own API (httpx)", own)):
            print(f"  {name:18} p50 {pct(samples, 0.5) * 1000:7.1f} ms   p95 {pct(samples, 0.95) * 1000:7.1f} ms")
        print(f"  ratio wire / own: p50 {pct(wire, 0.5) / pct(own, 0.5):.2f}×   "
              f"p95 {pct(wire, 0.95) / pct(own, 0.95):.2f}×")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
