"""Per-command overhead of the sandbox against a plain subprocess, both running ``true``.

Usage: .venv/bin/python bench/sandbox_overhead.py [runs]   (default 100; the median of >= 50 counts)
Prints the median and p90 of each, the added milliseconds and the ratio. Target: <= 10 ms added.
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")
os.environ.setdefault("AGENTOPS_DEMO", "1")  # a local benchmark: the development secret key is fine

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from tools_app.sandbox import SandboxPolicy, run_sandboxed, sandbox_status, workspace_for  # noqa: E402


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    return f"median {statistics.median(ordered):7.2f} ms  p90 {ordered[int(len(ordered) * 0.9)]:7.2f} ms"


def main() -> None:
    runs = max(int(sys.argv[1]) if len(sys.argv) > 1 else 100, 50)
    root = tempfile.mkdtemp(prefix="agentops-bench-")
    os.chmod(root, 0o711)
    try:
        _bench(runs, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _bench(runs: int, root: str) -> None:
    settings.AGENTOPS_WORKSPACE_ROOT = Path(root)
    status = sandbox_status(refresh=True)
    print(f"backend: {status['backend']} ok={status['ok']} ({status['detail']})")
    workspace = workspace_for("bench")
    policy = SandboxPolicy(timeout_seconds=10)

    plain: list[float] = []
    sandboxed: list[float] = []
    for _ in range(5):  # warm caches (page cache, dentries) for both alike
        subprocess.run(["true"], check=True)
        run_sandboxed(workspace=workspace, command="true", policy=policy)
    for _ in range(runs):  # interleaved so drift affects both equally
        started = time.perf_counter()
        subprocess.run(["/bin/sh", "-c", "true"], stdin=subprocess.DEVNULL, capture_output=True, check=True)
        plain.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        result = run_sandboxed(workspace=workspace, command="true", policy=policy)
        sandboxed.append((time.perf_counter() - started) * 1000)
        if result.exit_code != 0 or result.error_code:
            raise SystemExit(f"sandboxed `true` failed: {result}")

    plain_median, sandbox_median = statistics.median(plain), statistics.median(sandboxed)
    print(f"runs: {runs}")
    print(f"plain subprocess (sh -c true): {_ms(plain)}")
    print(f"sandboxed (bwrap, sh -c true): {_ms(sandboxed)}")
    print(f"added per command: {sandbox_median - plain_median:.2f} ms (target <= 10 ms)")
    print(f"ratio sandboxed / plain: {sandbox_median / plain_median:.1f}x")


if __name__ == "__main__":
    main()
