import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")
django_asgi_app = get_asgi_application()  # sets Django up; serves the async views

from django.conf import settings  # noqa: E402

from agentops.asgi_handler import OneHopASGIHandler  # noqa: E402

one_hop_app = OneHopASGIHandler()


async def django_http(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Every request in one worker-thread hop, but those of the async views (see asgi_handler)."""
    path = str(scope.get("path", ""))
    app = django_asgi_app if path.startswith(settings.AGENTOPS_ASYNC_VIEW_PREFIXES) else one_hop_app
    await app(scope, receive, send)


from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from agentops.asyncdb import AuthMiddlewareStack  # noqa: E402
from agentops.middleware import BodyLimitASGI, RequestGateASGI  # noqa: E402
from agentops.routing import websocket_urlpatterns  # noqa: E402
from agentops.runtime import tune_gc  # noqa: E402

application = ProtocolTypeRouter({
    "http": BodyLimitASGI(RequestGateASGI(django_http)),
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})
tune_gc()  # the application is built: what daphne keeps for its lifetime is in memory
