"""Run every proof: ``python -m proof`` (short, CI-sized, < 5 min) or ``python -m proof --full``.

Each proof runs in a subprocess of its own (each sets Django up against a database of its own),
prints its table and verdicts; this prints the summary and exits non-zero when any target is
missed. ``make proof`` / ``make proof FULL=1`` call this.
"""

import argparse
import subprocess
import sys
import time

from proof._common import ROOT, print_table

# In order of the priorities; each is ``python -m proof.<name> [--full]``.
PROOFS = ["scale", "chaos", "load"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="full size (the README's Figures)")
    parser.add_argument("only", nargs="*", choices=[*PROOFS, []], help="run only these proofs")
    args = parser.parse_args()
    rows, failed = [], []
    started = time.perf_counter()
    for name in args.only or PROOFS:
        print(f"=== proof {name} ({'full' if args.full else 'short'}) ===", flush=True)
        start = time.perf_counter()
        code = subprocess.call([sys.executable, "-m", f"proof.{name}", *(["--full"] if args.full else [])], cwd=ROOT)
        rows.append([name, "PASS" if code == 0 else f"FAIL (exit {code})", f"{time.perf_counter() - start:.0f} s"])
        if code != 0:
            failed.append(name)
        print(flush=True)
    print(f"=== summary ({'full' if args.full else 'short'}, {time.perf_counter() - started:.0f} s) ===")
    print_table(["proof", "verdict", "took"], rows)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
