"""Real sandbox hosts for the multi-host tests: worker processes, each with its own workspace
root, and an engine worker and a model gateway whose workspace root is a path nobody can open
(a regular file's child: any attempt to open a workspace there fails and leaves a trace)."""

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from hosts_app.models import AgentHostPolicy, SandboxHost
from sessions_app.models import AgentProfile
from tests import factories
from tests.helpers import ROOT, database_url
from tests.waiting import wait_for
from tools_app.models import ToolDefinition
from tools_app.services import tool_definitions_seed


@dataclass
class Cluster:
    base: Path
    tmp: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def engine_root(self) -> Path:
        return self.base / "engine-cannot-open" / "workspaces"

    def root(self, host: str) -> Path:
        return self.base / f"host-{host}"

    def env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": settings.REDIS_URL,
               "AGENTOPS_ARTIFACT_ROOT": str(settings.AGENTOPS_ARTIFACT_ROOT),
               "AGENTOPS_LEASE_SECONDS": "3", "AGENTOPS_MODEL_TIMEOUT_SECONDS": "10",
               "AGENTOPS_SWEEP_SECONDS": "0.5", "AGENTOPS_HOST_HEARTBEAT_SECONDS": "0.5",
               "AGENTOPS_HOST_OFFLINE_SECONDS": "3", **extra}
        env.pop("DATABASE_TEST_NAME", None)
        return env

    def spawn(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, start_new_session=True)
        self.procs[name] = proc
        return proc

    def start_engine(self) -> None:
        """The engine (ticks, with beat: the sweepers) and the model gateway: no workspace here."""
        env = self.env(AGENTOPS_WORKSPACE_HOST="", AGENTOPS_WORKSPACE_ROOT=str(self.engine_root))
        self.spawn("engine", [sys.executable, "-m", "celery", "-A", "agentops", "worker", "-Q", "engine", "--pool",
                              "threads", "-c", "4", "-l", "warning", "-n", "engine@%h", "-B", "--schedule",
                              str(self.tmp / "beat")], env)
        self.spawn("gateway", [sys.executable, "manage.py", "model_gateway", "--concurrency", "20"], env)

    def start_host(self, name: str, labels: str) -> subprocess.Popen[bytes]:
        """``manage.py sandbox_host``: the documented one command per sandbox machine."""
        root = self.root(name)
        root.mkdir(mode=0o711, exist_ok=True)
        env = self.env(AGENTOPS_WORKSPACE_ROOT=str(root))
        return self.spawn(name, [sys.executable, "manage.py", "sandbox_host", "--name", name, "--labels", labels,
                                 "--concurrency", "2"], env)

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def wait_online(self, *names: str, timeout: float = 60) -> None:
        wait_for(lambda: SandboxHost.objects.filter(name__in=names, status="online").count() == len(names) or None,
                 timeout, f"hosts {names} online")


@pytest.fixture
def cluster(transactional_db: None, workspace_base: Path, tmp_path: Path) -> Iterator[Cluster]:
    base = workspace_base / f"cluster-{os.getpid()}-{tmp_path.name}"
    base.mkdir(mode=0o711)
    (base / "engine-cannot-open").write_text("a file: nothing can be created beneath it\n")
    c = Cluster(base=base, tmp=tmp_path)
    yield c
    for name in list(c.procs):
        c.kill(name)


@pytest.fixture
def people(transactional_db: None) -> tuple[User, User]:
    return factories.user("oscar", groups=["operators"]), factories.user("rita", groups=["reviewers"])


def zone_agent(model_url: str, zone: str) -> AgentProfile:
    """An agent with every built-in tool whose sessions need a host labelled ``zone``."""
    tool_definitions_seed()
    agent = factories.agent_profile(base_url=model_url, model="scripted")
    agent.tools.set(ToolDefinition.objects.all())
    AgentHostPolicy.objects.create(agent=agent, pool="default", labels=[zone])
    return agent
