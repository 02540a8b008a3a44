"""``python -m agentops.runner --url https://agentops.example --token aor_…``: a customer runner.

Loop: heartbeat → long-poll ``/api/runner/jobs/next`` → verify the signed job (``protocol``) →
record it in the journal, refused if it ran here before (``journal``: a replay never runs twice) →
run it in the local bubblewrap sandbox (``tools_app``'s built-ins; no database, no broker) while
posting progress → upload the result until the server acknowledges it (a re-sent result is
recorded once). A job that does not verify is reported as refused and never runs. Results not yet
acknowledged are kept in ``--state`` and sent again after a restart or a reconnect.
"""

import argparse
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from agentops.runner.journal import JobJournal
from agentops.runner.protocol import JobRefused, TokenWithoutKey, split_token, verify_job
from agentops.runner.results import refused_for_good, result_forget, result_keep, result_replace

log = logging.getLogger("agentops.runner")

NO_KEY_MESSAGE = (
    "{problem}: this runner verifies every job's signature with the public key its token carries "
    "(aor_<secret>.<public key>) and will not run a job it cannot verify. A token from before jobs were "
    "signed with Ed25519 has none. Ask an operator of the runner's team for a new token "
    "(POST /api/runners/<name>/token; the old one stops working at once) and start the runner with it.")


def configure_django(workdir: Path) -> None:
    """The few settings the sandbox and the built-in tools read; no database is configured."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["tools_app"], DATABASES={}, USE_TZ=True,
            AGENTOPS_WORKSPACE_ROOT=workdir / "workspaces",
            AGENTOPS_SANDBOX_UID=int(os.environ.get("AGENTOPS_SANDBOX_UID", "65534")),
            AGENTOPS_SANDBOX_GID=int(os.environ.get("AGENTOPS_SANDBOX_GID",
                                                    os.environ.get("AGENTOPS_SANDBOX_UID", "65534"))),
            AGENTOPS_SANDBOX_ALLOW_UNSAFE=os.environ.get("AGENTOPS_SANDBOX_ALLOW_UNSAFE", "") == "1",
            AGENTOPS_MAX_TOOL_TIMEOUT=int(os.environ.get("AGENTOPS_MAX_TOOL_TIMEOUT", "3600")),
        )
        django.setup()


class Runner:
    def __init__(self, *, url: str, token: str, workdir: Path, wait: float = 20.0) -> None:
        self.url = url.rstrip("/")
        # Only the secret travels (the bearer token); the public key is pinned here: a job signed
        # with anything else, by whoever sees our requests or the server's database, is refused.
        secret, self.key = split_token(token)
        self.workdir = workdir
        self.state = workdir / "pending-results"
        self.manifests = workdir / "manifests"
        self.journal = JobJournal(workdir / "jobs-run")
        self.state.mkdir(parents=True, exist_ok=True)
        self.manifests.mkdir(parents=True, exist_ok=True)
        self.wait = wait
        self.name = ""
        self.chunk_bytes = 256 * 1024  # until the server says how much a request may carry
        self.http = httpx.Client(headers={"Authorization": f"Bearer {secret}"}, timeout=wait + 30)
        self.stop = threading.Event()

    # --- talking to the server -----------------------------------------------------------------
    def post(self, path: str, body: dict[str, Any] | None = None, **params: Any) -> httpx.Response:
        response = self.http.post(f"{self.url}/api/runner{path}", json=body or {}, params=params)
        if response.status_code == 401:
            raise PermissionError(f"the server refused this runner's token (revoked?): {response.text[:300]}")
        return response

    def heartbeat(self) -> None:
        from tools_app.sandbox import sandbox_status

        body = {"versions": {"python": sys.version.split()[0], "runner": "1"}, "self_test": sandbox_status()}
        response = self.post("/heartbeat", body)
        response.raise_for_status()
        answer = response.json()
        self.name = answer["name"]
        self.chunk_bytes = int(answer.get("upload_chunk_bytes") or self.chunk_bytes)

    def _heartbeats(self) -> None:
        while not self.stop.wait(5):
            try:
                self.heartbeat()
            except PermissionError:
                self.stop.set()
            except httpx.HTTPError as exc:
                log.warning("heartbeat failed: %s", exc)

    def upload(self, job_id: str, folder: Path, item: dict[str, Any]) -> dict[str, Any]:
        """Send one published file in parts the server takes; what the result says of it (with
        ``not_uploaded`` when the server refused it for good). httpx.HTTPError: try again later."""
        meta = {"path": item["path"], "size": item["size"], "sha256": item["sha256"]}
        offset = 0
        with (folder / item["copy"]).open("rb") as source:
            while True:
                chunk = source.read(self.chunk_bytes)
                response = self.http.post(f"{self.url}/api/runner/jobs/{job_id}/files/{item['sha256']}",
                                          content=chunk, params={"offset": offset, "size": item["size"]},
                                          headers={"Content-Type": "application/octet-stream"})
                if response.status_code == 401:
                    raise PermissionError(f"the server refused this runner's token: {response.text[:300]}")
                if refused_for_good(response.status_code):
                    log.error("%s of %s refused: %s %s", item["path"], job_id, response.status_code,
                              response.text[:200])
                    return {**meta, "not_uploaded": f"the server refused it ({response.status_code}: "
                                                    f"{_message(response)})"}
                response.raise_for_status()
                offset += len(chunk)
                if offset >= item["size"] or not chunk:
                    return meta

    def deliver(self, path: Path) -> bool:
        """Send one kept result, its files first, until the server acknowledges it (True), or give
        up for now (False: a connection error or a 5xx, tried again). A result the server refuses
        for good (a 4xx) is replaced by a short failure saying so, which is sent instead: the step
        must not stay running, nor the runner stop polling, for a result that can never go."""
        doc = json.loads(path.read_text())
        job_id = doc["job_id"]
        try:
            files = [self.upload(job_id, path.with_suffix(".files"), item) for item in doc["files"]]
            response = self.post(f"/jobs/{job_id}/result", {"result": doc["result"], "files": files})
        except (httpx.HTTPError, OSError) as exc:
            log.warning("result of %s not delivered yet: %s", job_id, exc)
            return False
        if response.status_code in (200, 404):  # 404: the job is gone (session deleted)
            result_forget(path)
            return True
        if not refused_for_good(response.status_code):
            log.warning("result of %s not taken yet: %s %s", job_id, response.status_code, response.text[:200])
            return False
        log.error("result of %s refused for good: %s %s", job_id, response.status_code, response.text[:200])
        if doc.get("refused"):  # even the short failure: nothing more to say
            result_forget(path)
            return True
        result_replace(path, {"job_id": job_id, "files": [], "refused": True, "result": {
            "status": "failed", "error_code": "result_refused",
            "output": f"The job ran on runner {self.name}, but the server refused its result "
                      f"({response.status_code}: {_message(response)}); the runner dropped it."}})
        return self.deliver(path)

    def deliver_pending(self) -> None:
        for path in sorted(self.state.glob("*.json")):
            self.deliver(path)

    # --- running jobs --------------------------------------------------------------------------
    def run_job(self, envelope: dict[str, Any]) -> None:
        job, signature = envelope.get("job") or {}, envelope.get("signature") or ""
        job_id = str(job.get("job_id", ""))
        try:
            verify_job(key=self.key, runner=self.name, job=job, signature=signature)
        except JobRefused as exc:
            log.error("refused job %s: %s", job_id, exc)
            if job_id:
                self.post(f"/jobs/{job_id}/refused", {"reason": str(exc)})
            return
        if job["type"] == "manifest_check":
            self.manifest_check(job)  # reads only: answering one twice changes nothing
            return
        self.journal.prune()
        if not self.journal.record(job_id, float(job["expires_at"])):
            log.error("refused job %s: it already ran here (replayed)", job_id)
            self.post(f"/jobs/{job_id}/refused", {"reason": "replayed: this job already ran on this runner",
                                                   "replayed": True})
            return
        from tools_app.builtin import execute_tool
        from tools_app.sandbox import OutputBatcher, workspace_for, workspace_manifest

        workspace = workspace_for(job["session_id"])
        manifest = None
        if not job.get("idempotent"):
            manifest = workspace_manifest(workspace)
            (self.manifests / f"{job['step_id']}.json").write_text(json.dumps(manifest))

        def progress(batch: dict[str, Any]) -> None:
            try:
                self.post(f"/jobs/{job_id}/progress", {"output": str(batch.get("output", ""))})
            except (httpx.HTTPError, PermissionError) as exc:
                log.warning("progress of %s not sent: %s", job_id, exc)

        result = execute_tool(name=job["tool"], workspace=workspace, arguments=job["arguments"],
                              timeout_seconds=job["timeout_seconds"], network=job["network"],
                              idempotency_key=job_id, manifest_before=manifest,
                              live=OutputBatcher(progress, interval=0.5, max_bytes=64_000, max_batches=200))
        kept = result_keep(self.state, job_id, workspace, result.to_dict())
        failpoint = os.environ.get("AGENTOPS_RUNNER_FAILPOINT_BEFORE_RESULT", "")
        if failpoint:  # tests: the connection drops before the result is sent
            Path(failpoint).touch()
            time.sleep(3600)
        while not self.deliver(kept) and not self.stop.wait(1):
            pass

    def manifest_check(self, job: dict[str, Any]) -> None:
        from tools_app.sandbox import workspace_changed_since, workspace_for

        saved = self.manifests / f"{job['step_id']}.json"
        changed: bool | None = None
        if saved.exists():
            changed = workspace_changed_since(workspace_for(job["session_id"]), json.loads(saved.read_text()))
        self.post(f"/jobs/{job['job_id']}/manifest", {"changed": changed})

    def connect(self) -> bool:
        """The first heartbeat, tried again until the server answers (a runner started before
        its server, or while the network is down, waits for it: it stopped with a traceback);
        False: the token was refused, or the runner was asked to stop meanwhile."""
        pause = 1.0
        while not self.stop.is_set():
            try:
                self.heartbeat()
                return True
            except PermissionError as exc:
                log.error("%s; stopping", exc)
                return False
            except (httpx.HTTPError, ValueError, KeyError) as exc:  # unreachable, a 5xx, not agentops
                log.warning("cannot reach %s yet (%s); trying again in %.0f s", self.url, exc, pause)
                self.stop.wait(pause)
                pause = min(pause * 2, 30.0)
        return False

    def serve(self) -> int:
        if not self.connect():
            return 3
        threading.Thread(target=self._heartbeats, daemon=True, name="heartbeat").start()
        log.warning("runner %s connected to %s", self.name, self.url)
        self.deliver_pending()
        while not self.stop.is_set():
            try:
                response = self.post("/jobs/next", wait=self.wait)
                if response.status_code == 200:
                    self.run_job(response.json())
                elif response.status_code != 204:
                    log.warning("poll: %s %s", response.status_code, response.text[:200])
                    self.stop.wait(1)
            except PermissionError as exc:
                log.error("%s; stopping", exc)
                return 3
            except httpx.HTTPError as exc:
                log.warning("connection lost (%s); reconnecting", exc)
                self.stop.wait(1)
                self.deliver_pending()
        return 3 if self.stop.is_set() else 0


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message", ""))[:300]
    except (ValueError, AttributeError):
        return response.text[:300]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentops.runner", description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="agentops's base URL (https://…)")
    parser.add_argument("--token", default=os.environ.get("AGENTOPS_RUNNER_TOKEN", ""),
                        help="the runner's token (or AGENTOPS_RUNNER_TOKEN)")
    parser.add_argument("--workdir", default=os.environ.get("AGENTOPS_RUNNER_WORKDIR",
                                                            f"/var/tmp/agentops-runner-{os.getuid()}"))
    parser.add_argument("--wait", type=float, default=20.0, help="long-poll seconds")
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("--token (or AGENTOPS_RUNNER_TOKEN) is required")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s runner %(levelname)s %(message)s")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o711)
    configure_django(workdir)
    try:
        runner = Runner(url=args.url, token=args.token, workdir=workdir, wait=args.wait)
    except TokenWithoutKey as exc:
        log.error(NO_KEY_MESSAGE.format(problem=str(exc).capitalize()))
        return 2
    return runner.serve()


if __name__ == "__main__":
    sys.exit(main())
