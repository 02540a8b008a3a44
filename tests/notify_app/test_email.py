"""Email to the eligible reviewers through Django's email backend: who gets it, what it says
(never a secret value; no arguments when the policy omits them), and its signed one-time link
(login still required; only for its recipient; once)."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core import mail
from django.test import Client

from approvals_app.assignment import approval_escalate_due
from notify_app.models import Delivery
from notify_app.services import delivery_send
from tests import factories
from tests.approvals_app.review_helpers import approve, pending, policy, reviewers
from tests.helpers import login

pytestmark = pytest.mark.django_db


def _send_all() -> None:
    for pk in Delivery.objects.filter(channel="email", status="pending").values_list("pk", flat=True):
        delivery_send(delivery_pk=pk)


def test_email_goes_to_eligible_reviewers_with_a_one_time_link() -> None:
    deployers = Group.objects.create(name="deployers")
    alice, bob = reviewers(2, group=deployers)
    (outsider,) = reviewers(1)
    factories.user(groups=["operators"], email="op@example.org")  # not a reviewer
    policy(team=factories.team(), tool_name="run_command", reviewer_group=deployers, risk="high",
           required_approvals=2)
    approval = pending(arguments={"command": "deploy", "password": "hunter2"})
    _send_all()
    assert sorted(m.to[0] for m in mail.outbox) == sorted([alice.email, bob.email])
    message = next(m for m in mail.outbox if m.to == [alice.email])
    assert message.subject == "[agentops] run_command waits for your review (high risk)"
    assert "Approvals required: 2" in message.body and '"command": "deploy"' in message.body
    assert "hunter2" not in message.body and "[redacted]" in message.body
    link = re.search(r"http://\S+/approvals/link/(\S+)/", str(message.body))
    assert link is not None and outsider.email not in [m.to[0] for m in mail.outbox]
    path = f"/approvals/link/{link.group(1)}/"
    assert login(bob).get(path).status_code == 403  # not bob's link
    anonymous = Client().get(path)
    assert anonymous.status_code == 302 and "/login" in anonymous["Location"]  # login still required
    browser = login(alice)
    opened = browser.get(path)
    assert opened.status_code == 302 and opened["Location"] == f"/approvals/{approval.request_id}/"
    assert browser.get(path).status_code == 410  # once
    assert browser.get("/approvals/link/forged-token/").status_code == 404


def test_decision_and_escalation_mail_and_omitted_arguments() -> None:
    leads = Group.objects.create(name="leads")
    (lead,) = reviewers(1, group=leads)
    (rev,) = reviewers(1)
    policy(team=factories.team(), tool_name="run_command", omit_arguments=True, escalation_group=leads,
           ttl_seconds=3600, escalate_before_seconds=600)
    approval = pending(arguments={"command": "rm -rf /data"})
    approval_escalate_due(now=approval.created_at + timedelta(seconds=3100))
    _send_all()
    escalated = [m for m in mail.outbox if "escalated" in m.subject]
    assert [m.to for m in escalated] == [[lead.email]]
    assert all("rm -rf" not in m.body and "not sent by email (policy)" in m.body for m in mail.outbox)
    mail.outbox.clear()
    approve(approval, rev, decision="reject", reason="no")
    _send_all()
    assert mail.outbox and all("was decided" in m.subject for m in mail.outbox)
