from typing import Any

from approvals_app.routing import websocket_urlpatterns as approval_routes
from sessions_app.routing import websocket_urlpatterns as session_routes

websocket_urlpatterns: list[Any] = [*session_routes, *approval_routes]
