from django.contrib import admin
from django.urls import path

from agentops import health
from agentops.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", health.healthz_view, name="healthz"),
    path("api/", api.urls),
]
