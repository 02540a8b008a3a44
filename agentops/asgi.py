import asyncio
import logging
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


def _warm_up() -> None:
    """Compile what the first WebSockets' backlogs render (the fragments' templates, the URL
    resolver, the batch reads) before the first client, as the announcer does: in a cold web
    process the first 200 watchers' backlogs spent a sixth of their rendering compiling templates
    and filling the resolver, while the sessions they watched were being created."""
    from django.db import connections

    from sessions_app import fragments

    try:
        asyncio.get_running_loop()
        return  # imported by async code (a test's communicator), where the ORM may not run
    except RuntimeError:
        pass  # imported by a server before its loop runs
    try:
        fragments.warm_up()
    except Exception:  # a database not there yet: the first backlog compiles what it needs
        logging.getLogger(__name__).warning("web: warming up failed", exc_info=True)
    finally:
        connections.close_all()  # the loop's thread never uses it


_warm_up()
tune_gc()  # the application is built: what daphne keeps for its lifetime is in memory
