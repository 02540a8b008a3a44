"""The engine: a turn advances in short, idempotent Celery tasks over the durable state.

- ``services``: what interfaces call (start a session, submit a turn, cancel, client tool output).
- ``driver``: one tick: lock the turn, decide the next action, claim it, do it or hand it off.
- ``llm``: the model call through the openai SDK (claimable, retried, streamed into events).
- ``tools``: gate and run tool steps (inline for read-only tools, the sandbox queue otherwise).
- ``recovery``: the sweeper for expired leases and expired approvals.
"""
