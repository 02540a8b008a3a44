from django.dispatch import Signal

# Sent after a decision is committed; the engine connects it in its AppConfig.ready()
# (approvals_app must not import the engine). kwargs: request_id, turn_id, step_id, status.
approval_decided = Signal()
