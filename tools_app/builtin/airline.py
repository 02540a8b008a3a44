"""The airline rebooking desk's tools (the demo of subagents): flight search, seat holds, rebooking.

They work on the desk's data in the session's workspace (``data/flights.json``, written by the
demo's starter files), so each session sees its own inventory and nothing leaves the workspace:
a hold is recorded in ``holds/<case>.json`` (reversible: ``release``), a rebooking in
``outputs/rebooking-<case>.json`` (published as an artifact). Rebooking is ``mutating``: a human
decides every call, with the passengers, flights and seats on the reviewer's page.
"""

import json
import os
import stat
from typing import Any

from tools_app.sandbox import open_beneath, sandbox_ids

from .files import _read_regular, published_from_changes
from .registry import ToolContext, ToolError, ToolResult

FLIGHTS_FILE = "data/flights.json"

SEARCH_FLIGHTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"origin": {"type": "string"}, "destination": {"type": "string"},
                   "min_seats": {"type": "integer", "minimum": 1}},
    "additionalProperties": False,
}
HOLD_SEATS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"case": {"type": "string", "pattern": "^[A-Za-z0-9-]{1,40}$"}, "flight": {"type": "string"},
                   "seats": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 9},
                   "release": {"type": "boolean"}},
    "required": ["case", "flight", "seats"],
    "additionalProperties": False,
}
REBOOK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "case": {"type": "string", "pattern": "^[A-Za-z0-9-]{1,40}$"},
        "from_flight": {"type": "string"}, "to_flight": {"type": "string"},
        "passengers": {"type": "array", "minItems": 1, "maxItems": 9, "items": {
            "type": "object", "properties": {"name": {"type": "string"}, "seat": {"type": "string"},
                                             "age": {"type": "integer"}},
            "required": ["name", "seat"], "additionalProperties": False}},
        "reason": {"type": "string"},
    },
    "required": ["case", "from_flight", "to_flight", "passengers"],
    "additionalProperties": False,
}


def _flights(ctx: ToolContext) -> dict[str, Any]:
    try:
        data, _size = _read_regular(ctx.workspace, FLIGHTS_FILE, 1_000_000)
        flights: dict[str, Any] = json.loads(data)
    except (OSError, ValueError) as exc:
        raise ToolError("no_inventory", f"cannot read the seat inventory {FLIGHTS_FILE}: {exc}") from exc
    return flights


def _write_json(ctx: ToolContext, rel: str, value: Any) -> None:
    fd = open_beneath(ctx.workspace, rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o644,
                      create_parents=True)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ToolError("invalid_arguments", f"{rel!r} is not a regular file")
        uid, gid = sandbox_ids()
        os.fchown(fd, uid, gid)
        os.write(fd, json.dumps(value, indent=1).encode())
    finally:
        os.close(fd)


def search_flights(ctx: ToolContext) -> ToolResult:
    inventory = _flights(ctx)
    args = ctx.arguments
    found = [f for f in inventory.get("candidates", [])
             if (not args.get("origin") or f["origin"] == args["origin"])
             and (not args.get("destination") or f["destination"] == args["destination"])
             and len(f.get("free_seats", [])) >= int(args.get("min_seats") or 1)]
    return ToolResult(status="completed", output=json.dumps({"cancelled": inventory.get("cancelled"),
                                                            "candidates": found}, indent=1),
                      data={"count": len(found)})


def _flight(inventory: dict[str, Any], number: str) -> dict[str, Any]:
    for flight in inventory.get("candidates", []):
        if flight["flight"] == number:
            return dict(flight)
    raise ToolError("unknown_flight", f"no candidate flight {number!r}")


def hold_seats(ctx: ToolContext) -> ToolResult:
    args = ctx.arguments
    flight = _flight(_flights(ctx), args["flight"])
    missing = [s for s in args["seats"] if s not in flight.get("free_seats", [])]
    if missing and not args.get("release"):
        raise ToolError("seat_unavailable", f"seats {missing} are not free on {args['flight']}")
    rel = f"holds/{args['case']}.json"
    hold = {"case": args["case"], "flight": args["flight"], "seats": args["seats"],
            "status": "released" if args.get("release") else "held"}
    _write_json(ctx, rel, hold)
    verb = "released" if args.get("release") else "held"
    return ToolResult(status="completed", output=f"{verb} {', '.join(args['seats'])} on {args['flight']} "
                                                 f"for case {args['case']}", data=hold)


def rebook_passengers(ctx: ToolContext) -> ToolResult:
    args = ctx.arguments
    flight = _flight(_flights(ctx), args["to_flight"])
    seats = [p["seat"] for p in args["passengers"]]
    missing = [s for s in seats if s not in flight.get("free_seats", [])]
    if missing:
        raise ToolError("seat_unavailable", f"seats {missing} are not free on {args['to_flight']}")
    rel = f"outputs/rebooking-{args['case']}.json"
    record = {**args, "status": "rebooked", "departs": flight.get("departs"), "arrives": flight.get("arrives")}
    _write_json(ctx, rel, record)
    published = published_from_changes(ctx.workspace, [rel])
    return ToolResult(status="completed", output=f"rebooked case {args['case']} on {args['to_flight']}: "
                                                 + ", ".join(f"{p['name']} {p['seat']}" for p in args["passengers"]),
                      files_changed={"created": [rel], "modified": [], "deleted": []}, published_files=published,
                      data=record)
