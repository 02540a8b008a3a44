"""The engine: a turn advances in short, idempotent Celery tasks over the durable state.

The loop::

    turn_submit ──► tick ──► model ──► tools inline ──► model ──► … ──► tick
                     ▲         │ (read-only tools: same worker, one write per step)
                     │         └──► tick ──► gate ──► approval ── reviewer decides ──┐
                     │                         │                                     │
                     │                         └──► sandbox (run_command, …) ──► tick ◄┘
                     └──────────── sweeper (expired leases, lost ticks) ─────────────┘

- ``commands``: what the interfaces call: start a session, submit a turn, cancel, client tool output.
- ``tick``: one tick: load the snapshot under the session lock, decide, apply; ``turn_advance``
  runs the work a tick claimed for this worker and ticks again.
- ``plan``: the decision, a pure function ``next_action(Snapshot) -> Decision`` (an ``Action``).
- ``model_step``: a claimed model call, its reply recorded; read-only tools run inline.
- ``llm``: the openai SDK call (retries, streamed deltas); ``prompt``: what the model is sent.
- ``tool_steps``: gate, claim (consuming the approval), run and record a tool step.
- ``record``: the one-statement record of a step's outcome (the guarded transitions' fast path).
- ``budgets``, ``turns``: budget checks; failing and cancelling a turn.
- ``recovery``: the sweeper: expired approvals, expired leases, lost ticks.

Work moves between workers only through ``agentops.dispatch`` (by task name, after commit):
queue ``engine`` for ticks, ``llm`` for model calls, ``sandbox`` for commands.
"""
