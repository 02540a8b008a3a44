"""The settings in demo mode, for the test suite (pytest-django) and mypy's Django plugin: no
secret key needed (agentops/settings.py refuses the development key otherwise). The processes
the tests start (daphne, workers) inherit AGENTOPS_DEMO from the environment set here."""

import os

os.environ.setdefault("AGENTOPS_DEMO", "1")

from agentops.settings import *  # noqa: E402, F403
