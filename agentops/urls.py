from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from agentops import health
from agentops.api import api
from approvals_app import review_views
from approvals_app import views as approval_views
from approvals_app.api import router as approvals_router
from fanout_app import views as fanout_views
from fanout_app.api import router as fanout_router
from hosts_app import views as host_views
from hosts_app.api import router as hosts_router
from hosts_app.runner_api import router as runner_router
from mcp_app.api import router as mcp_router
from notify_app import views as notify_views
from openai_api.api import api as openai_api
from sessions_app import views as session_views
from sessions_app.api import router as sessions_router
from vault_app.api import router as vault_router

# A server error: 503 when the database did not answer, the API's JSON shape under /api/ and /openai/.
handler500 = "agentops.errors.server_error"

api.add_router("", fanout_router)  # before sessions: /sessions/batch is not a session id
api.add_router("", sessions_router)
api.add_router("", approvals_router)
api.add_router("", vault_router)
api.add_router("", hosts_router)
api.add_router("/runner", runner_router)
api.add_router("", mcp_router)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", health.healthz_view, name="healthz"),
    path("api/", api.urls),
    path("openai/v1/", openai_api.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", session_views.overview_view, name="overview"),
    path("health-panel/", session_views.health_panel_view, name="health_panel"),
    path("sessions/", session_views.session_list_view, name="session_list"),
    path("sessions/new/", session_views.session_create_view, name="session_create"),
    path("sessions/<uuid:session_id>/", session_views.session_detail_view, name="session_detail"),
    path("sessions/<uuid:session_id>/timeline/", session_views.session_timeline_view, name="session_timeline"),
    path("sessions/<uuid:session_id>/turns/", session_views.turn_submit_view, name="turn_submit"),
    path("sessions/<uuid:session_id>/cancel/", session_views.session_cancel_view, name="session_cancel"),
    path("sessions/<uuid:session_id>/budget/", session_views.session_budget_view, name="session_budget"),
    path("sessions/<uuid:session_id>/turns/<uuid:turn_id>/retry/", session_views.turn_retry_view,
         name="turn_retry"),
    path("sessions/<uuid:session_id>/compact/", session_views.session_compact_view, name="session_compact"),
    path("sessions/<uuid:session_id>/pinned/", session_views.session_pinned_view, name="session_pinned"),
    path("sessions/<uuid:session_id>/artifacts/<uuid:artifact_id>/", session_views.artifact_download_view,
         name="artifact_download"),
    path("batches/", fanout_views.batch_list_view, name="batch_list"),
    path("sessions/<uuid:session_id>/subagents/", fanout_views.subagent_children_view, name="subagent_children"),
    path("batches/new/", fanout_views.batch_create_view, name="batch_create"),
    path("batches/<uuid:batch_id>/", fanout_views.batch_detail_view, name="batch_detail"),
    path("batches/<uuid:batch_id>/cancel/", fanout_views.batch_cancel_view, name="batch_cancel"),
    path("approvals/", approval_views.approval_queue_view, name="approval_queue"),
    path("approvals/<uuid:request_id>/", approval_views.approval_detail_view, name="approval_detail"),
    path("approvals/<uuid:request_id>/decide/", approval_views.approval_decide_view, name="approval_decide"),
    path("approvals/<uuid:request_id>/claim/", review_views.approval_claim_view, name="approval_claim"),
    path("approvals/<uuid:request_id>/release/", review_views.approval_release_view, name="approval_release"),
    path("approvals/bulk/", review_views.approval_bulk_view, name="approval_bulk"),
    path("approvals/link/<str:token>/", notify_views.notify_link_view, name="notify_link"),
    path("grants/<int:grant_id>/revoke/", approval_views.grant_revoke_view, name="grant_revoke"),
    path("hosts/", host_views.host_list_view, name="host_list"),
]
