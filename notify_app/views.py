"""The page an email's one-time link opens: it redeems the link and goes to the decision page
(login still required; the decision page checks the team as always)."""

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET

from agentops.domain import DomainError
from agentops.http import AuthedRequest
from notify_app.services import link_redeem


@require_GET
@login_required
def notify_link_view(request: AuthedRequest, token: str) -> HttpResponse:
    try:
        request_id = link_redeem(token=token, user=request.user)
    except DomainError as exc:
        return HttpResponse(exc.message, status=exc.status, content_type="text/plain")
    return redirect("approval_detail", request_id)
