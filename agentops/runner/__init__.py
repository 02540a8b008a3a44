"""The customer runner: ``python -m agentops.runner --url https://… --token …``.

It runs in the customer's network, connects out to agentops over HTTP(S) (no broker, no database,
no inbound port), long-polls for the jobs of its team's sessions pinned to it, verifies each job's
signature and approval hash, runs it in the local bubblewrap sandbox and uploads the result
(idempotently: a re-sent result is recorded once). ``protocol`` is shared with the server.
"""
