"""Typed requests for the interfaces: what the middleware and the auth layer have set on them."""

from django.contrib.auth.models import User
from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class AuthedRequest(HttpRequest):
    """A request past authentication (``login_required``, the API's auth): ``user`` is a real User."""

    user: User


class HtmxHttpRequest(AuthedRequest):
    """An authenticated dashboard request; ``htmx`` is set by django-htmx's middleware."""

    htmx: HtmxDetails
