"""The hosts page: every sandbox host the user may see, its status, load and self-test."""

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agentops.http import AuthedRequest
from hosts_app import selectors


@require_GET
@login_required
def host_list_view(request: AuthedRequest) -> HttpResponse:
    hosts = list(selectors.hosts_visible(request.user))
    return render(request, "dashboard/host_list.html", {"nav": "hosts", "hosts": hosts})
