from django.urls import path

from approvals_app.consumers import ApprovalsConsumer

websocket_urlpatterns = [
    path("ws/approvals/", ApprovalsConsumer.as_asgi()),
]
