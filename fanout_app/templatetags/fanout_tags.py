"""Lineage and child cards on dashboard pages owned by other apps (a tag, so their views stay as they are)."""

from typing import Any

from django import template
from django.template.loader import render_to_string
from django.utils.html import escape

from fanout_app.selectors import subagent_children, subagent_lineage

register = template.Library()


@register.filter
def subagents_active(children: list[dict[str, Any]]) -> bool:
    """Whether a child is still working (the cards then poll for its status)."""
    return any(c["turn_status"] not in {"completed", "failed", "cancelled"} for c in children)


@register.inclusion_tag("fanout/_lineage.html")
def subagent_lineage_card(session_id: Any) -> dict[str, Any]:
    return {"lineage": subagent_lineage(session_id)}


@register.inclusion_tag("fanout/_children.html")
def subagent_children_card(session_id: Any) -> dict[str, Any]:
    return {"children": subagent_children(session_id), "session_id": session_id}


def children_fragment(event: dict[str, Any]) -> str:
    """The live update of a parent's subagent cards: the card re-rendered, replacing the page's."""
    session_id = event["session_id"]
    html = render_to_string("fanout/_children.html", subagent_children_card(session_id))
    return (f'<template data-op="replace" data-target="#subagents-{escape(session_id)}" '
            f'data-seq="{int(event["seq"])}">{html}</template>')
