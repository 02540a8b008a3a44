"""The engine: a turn advances by ticks over the durable state; model calls run in the gateway.

The loop::

    turn_submit ──► gateway: tick ──► model ──► tools inline ──► model ──► … ──► tick
                                        │ (read-only tools: one write per step, no hop)
                                        └──► tick ──► gate ──► approval ── reviewer decides
                                                      │                        │
                     Celery: tick ◄── sandbox ◄───────┘ (run_command, …)       │
                       │    ▲                                                  │
                       │    └────────────────── tick ◄─────────────────────────┘
                       └──► model step planned ──► gateway (Redis stream) ──► model …
    sweeper (Celery beat): expired leases, expired approvals, lost ticks

- ``commands``: what the interfaces call: start a session, submit a turn, cancel, client tool output.
- ``tick``: one tick: load the snapshot under the session lock, decide, apply; ``turn_advance``
  (Celery) runs the in-process tools a tick claimed and ticks again.
- ``plan``: the decision, a pure function ``next_action(Snapshot) -> Decision`` (an ``Action``).
- ``gateway``: the asyncio process that drives turns around their model calls (``turn_drive``),
  holding hundreds of calls at once without a thread or a connection per call.
- ``model_step``: a claimed model step's reply recorded; read-only tools run inline.
- ``llm``: the openai SDK call (async; retries, 429 pauses, streamed deltas); ``prompt``: what the
  model is sent.
- ``tool_steps``: gate, claim (consuming the approval), run and record a tool step.
- ``record``: the one-statement record of a step's outcome (the guarded transitions' fast path).
- ``budgets``, ``turns``: budget checks; failing and cancelling a turn.
- ``recovery``: the sweeper: expired approvals, expired leases, lost ticks.

Work moves between workers only through ``agentops.dispatch`` (after commit): the Redis stream
``agentops:model-steps`` to the gateways, the Celery queue ``engine`` for ticks and ``sandbox``
for commands.
"""
