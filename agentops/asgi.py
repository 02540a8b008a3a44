import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from agentops.asyncdb import AuthMiddlewareStack  # noqa: E402
from agentops.middleware import BodyLimitASGI, RequestGateASGI  # noqa: E402
from agentops.routing import websocket_urlpatterns  # noqa: E402
from agentops.runtime import tune_gc  # noqa: E402

application = ProtocolTypeRouter({
    "http": BodyLimitASGI(RequestGateASGI(django_asgi_app)),
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})
tune_gc()  # the application is built: what daphne keeps for its lifetime is in memory
