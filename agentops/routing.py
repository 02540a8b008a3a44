from typing import Any

websocket_urlpatterns: list[Any] = []
