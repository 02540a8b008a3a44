"""Proofs of agentops's claims at scale, under load and faults (issue 13).

Each proof is a module with ``run(full: bool) -> Result``; ``python -m proof`` runs them all
(short, CI-sized form) and ``python -m proof --full`` at full size. Every proof prints a table
with ratios measured in the same run and a verdict per target. Proofs start what they need in a
database (and ports) of their own and leave nothing running.
"""
