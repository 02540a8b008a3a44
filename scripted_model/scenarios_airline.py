"""The airline rebooking desk, played deterministically (the subagents demo).

A flight is cancelled; one session per difficult case. Each case session searches the seat
inventory, delegates the seat-placement check and the arrival-time check to two subagents, writes
its recommendation (``outputs/recommendation-<case>.json``, with the rejected candidates and why)
and a Python script that verifies it against the case's constraints, runs the script in the
sandbox, holds the seats and asks for the rebooking (a human decides). The data lives in the
agent's starter files (``AIRLINE_STARTER_FILES``) and the case inputs in ``AIRLINE_CASES``.

``airline_steps(text)`` recognises a case's or a subagent's prose input and returns its script;
None for anything else (the planner then plays the incident demo).
"""

import json
import re
from typing import Any

from scripted_model.script import ScriptStep, ToolCall

CANCELLED = {"flight": "UA 100", "origin": "ORD", "destination": "BOS", "departs": "2026-12-02T08:00",
             "status": "cancelled"}
CANDIDATES: list[dict[str, Any]] = [
    {"flight": "UA 412", "origin": "ORD", "destination": "BOS", "departs": "2026-12-02T07:30",
     "arrives": "2026-12-02T10:45", "free_seats": ["22C"]},
    {"flight": "AA 1180", "origin": "ORD", "destination": "BOS", "departs": "2026-12-02T08:15",
     "arrives": "2026-12-02T11:30", "free_seats": ["8A", "12C", "19F", "27B"]},
    {"flight": "DL 2290", "origin": "ORD", "destination": "BOS", "departs": "2026-12-02T09:00",
     "arrives": "2026-12-02T12:10", "free_seats": ["14A", "14B", "14C", "14D", "30E"]},
    {"flight": "B6 904", "origin": "MDW", "destination": "BOS", "departs": "2026-12-02T07:00",
     "arrives": "2026-12-02T10:05", "free_seats": ["3A", "3B"]},
]
AIRLINE_STARTER_FILES = {"data/flights.json": json.dumps({"cancelled": CANCELLED, "candidates": CANDIDATES},
                                                         indent=1) + "\n"}

FAMILY = [{"name": "Ana Ruiz", "age": 41}, {"name": "Luis Ruiz", "age": 43}, {"name": "Sofia Ruiz", "age": 8},
          {"name": "Mateo Ruiz", "age": 5}]
CASES: dict[str, dict[str, Any]] = {
    "FAM-4": {
        "passengers": FAMILY, "together": True, "origin": None,
        "choice": {"flight": "DL 2290", "seats": ["14A", "14B", "14C", "14D"]},
        "rejected": [{"flight": "UA 412", "reason": "one seat left (22C); the booking is four passengers"},
                     {"flight": "AA 1180", "reason": "four seats free (8A, 12C, 19F, 27B) but in four different "
                                                     "rows: the family, two of them children, cannot sit together"}],
        "input": "Rebooking case FAM-4: flight UA 100 ORD→BOS tomorrow 08:00 is cancelled. One booking, four "
                 "passengers: Ana Ruiz (41), Luis Ruiz (43), Sofia Ruiz (8), Mateo Ruiz (5). The family must sit "
                 "together. Find the best alternative flight and seats.",
    },
    "ORD-1": {
        "passengers": [{"name": "Dana Kim", "age": 35}], "together": False, "origin": "ORD",
        "choice": {"flight": "UA 412", "seats": ["22C"]},
        "rejected": [{"flight": "B6 904", "reason": "departs from Midway (MDW); the traveller must leave from "
                                                    "O'Hare (ORD)"}],
        "input": "Rebooking case ORD-1: flight UA 100 ORD→BOS tomorrow 08:00 is cancelled. Dana Kim (35) must "
                 "leave from O'Hare (ORD) tomorrow morning. Find the best alternative flight and seat.",
    },
}
AIRLINE_CASES = [{"input": case["input"], "title": f"Rebooking case {case_id}"} for case_id, case in CASES.items()]
AIRLINE_INSTRUCTIONS = (
    "You are the airline rebooking desk. For the case you are given: search the candidate flights "
    "(search_flights), delegate the seat-placement check and the arrival-time check to two subagents "
    "(spawn_subagents, handing them data/flights.json), write your recommendation as JSON to "
    "outputs/recommendation-<case>.json (chosen flight and seats, and every rejected candidate with its reason), "
    "write a Python script that verifies the recommendation against the case's constraints and run it "
    "(run_command), hold the seats (hold_seats), then ask for the rebooking (rebook_passengers): a human decides."
)

_CASE = re.compile(r"Rebooking case ([A-Z0-9-]+):")
_CHECK = re.compile(r"(Seat-placement|Arrival-time) check for case ([A-Z0-9-]+)")


def _call(index: int, name: str, arguments: dict[str, Any]) -> ScriptStep:
    return ScriptStep(index, (ToolCall(name=name, arguments=json.dumps(arguments)),))


def _seats_together(seats: list[str]) -> bool:
    rows = {s[:-1] for s in seats}
    letters = sorted(ord(s[-1]) for s in seats)
    return len(rows) == 1 and letters == list(range(letters[0], letters[0] + len(letters)))


def _check_answer(kind: str, case_id: str) -> str:
    case = CASES[case_id]
    n = len(case["passengers"])
    if kind == "Seat-placement":
        verdicts = []
        for f in CANDIDATES:
            free = f["free_seats"]
            ok = len(free) >= n and (not case["together"] or any(
                _seats_together(free[i:i + n]) for i in range(len(free) - n + 1)))
            verdicts.append({"flight": f["flight"], "fits": ok, "free_seats": len(free)})
        return json.dumps({"check": "seat-placement", "case": case_id, "verdicts": verdicts})
    verdicts = [{"flight": f["flight"], "departs_from": f["origin"], "arrives": f["arrives"],
                 "ok": f["arrives"] <= "2026-12-02T13:00" and (case["origin"] in (None, f["origin"]))}
                for f in CANDIDATES]
    return json.dumps({"check": "arrival-time", "case": case_id, "verdicts": verdicts})


VERIFY_SCRIPT = '''import json, sys
rec = json.load(open("outputs/recommendation-{case}.json"))
inv = json.load(open("data/flights.json"))
flight = next(f for f in inv["candidates"] if f["flight"] == rec["flight"])
seats, n = rec["seats"], len(rec["passengers"])
problems = []
if len(seats) != n: problems.append("one seat per passenger")
if any(s not in flight["free_seats"] for s in seats): problems.append("every seat is free")
if rec.get("origin") and flight["origin"] != rec["origin"]: problems.append("leaves from " + rec["origin"])
if rec.get("together"):
    rows = {{s[:-1] for s in seats}}; letters = sorted(ord(s[-1]) for s in seats)
    if len(rows) != 1 or letters != list(range(letters[0], letters[0] + n)): problems.append("seated together")
if not all(r.get("reason") for r in rec["rejected"]): problems.append("every rejection has a reason")
print("FAILED: " + "; ".join(problems) if problems else "OK: {case} verified: %s seats %s" % (rec["flight"], seats))
sys.exit(1 if problems else 0)
'''


def _case_steps(case_id: str) -> list[ScriptStep]:
    case = CASES[case_id]
    choice = case["choice"]
    passengers = [{**p, "seat": seat} for p, seat in zip(case["passengers"], choice["seats"], strict=True)]
    recommendation = {"case": case_id, "flight": choice["flight"], "seats": choice["seats"],
                      "passengers": passengers, "origin": case["origin"], "together": case["together"],
                      "rejected": case["rejected"]}
    checks = {"input": {"case": case_id, "passengers": len(case["passengers"]), "together": case["together"],
                        "origin": case["origin"]}, "files": ["data/flights.json"], "tools": ["read_file"]}
    command = (f"mkdir -p outputs && cat > outputs/recommendation-{case_id}.json <<'JSON'\n"
               f"{json.dumps(recommendation, indent=1)}\nJSON\n"
               f"cat > verify.py <<'PY'\n{VERIFY_SCRIPT.format(case=case_id)}PY\npython3 verify.py")
    rejected = "; ".join(f"{r['flight']}: {r['reason']}" for r in case["rejected"])
    return [
        _call(0, "search_flights", {"destination": "BOS"}),
        _call(1, "spawn_subagents", {"tasks": [
            {"instructions": f"Seat-placement check for case {case_id}: which candidates can seat the "
                             f"passengers{' together' if case['together'] else ''}? Read inputs/data/flights.json.",
             **checks},
            {"instructions": f"Arrival-time check for case {case_id}: which candidates land in BOS by 13:00"
                             f"{' and leave from ' + case['origin'] if case['origin'] else ''}? "
                             "Read inputs/data/flights.json.", **checks}]}),
        _call(2, "run_command", {"command": command}),
        _call(3, "hold_seats", {"case": case_id, "flight": choice["flight"], "seats": choice["seats"]}),
        _call(4, "rebook_passengers", {"case": case_id, "from_flight": CANCELLED["flight"],
                                       "to_flight": choice["flight"], "passengers": passengers,
                                       "reason": f"UA 100 cancelled; rejected {rejected}"}),
        ScriptStep(5, (), f"Case {case_id} rebooked on {choice['flight']} seats {', '.join(choice['seats'])}. "
                          f"Rejected: {rejected}. The recommendation is outputs/recommendation-{case_id}.json, "
                          "verified by verify.py in the sandbox."),
    ]


def airline_steps(text: str) -> list[ScriptStep] | None:
    """The script of a rebooking case or of one of its subagent checks; None: not the airline demo."""
    check = _CHECK.search(text)
    if check and check.group(2) in CASES:
        return [_call(0, "read_file", {"path": "inputs/data/flights.json"}),
                ScriptStep(1, (), _check_answer(check.group(1), check.group(2)))]
    case = _CASE.search(text)
    if case and case.group(1) in CASES:
        return _case_steps(case.group(1))
    return None
