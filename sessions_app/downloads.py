"""The one way an artifact's file leaves the server, for the API and the dashboard alike.

An artifact is whatever an agent wrote: an ``.html`` or ``.svg`` opened in our origin would run
its scripts with the viewer's session. So every download is an attachment, only a few inert
types keep their content type (anything else is ``application/octet-stream``), and
``X-Content-Type-Options: nosniff`` stops the browser from guessing a more dangerous one.
"""

from pathlib import PurePosixPath

from django.http import FileResponse

from sessions_app.selectors import ArtifactFile

# Types a browser shows without running anything.
SAFE_CONTENT_TYPES = frozenset({"text/plain", "text/csv", "application/json", "application/pdf", "image/png",
                                "image/jpeg", "image/gif", "image/webp"})
FALLBACK_CONTENT_TYPE = "application/octet-stream"


def artifact_content_type(content_type: str) -> str:
    """The type an artifact is served as: its own when inert, else a type nothing renders."""
    bare = content_type.split(";", 1)[0].strip().lower()
    return bare if bare in SAFE_CONTENT_TYPES else FALLBACK_CONTENT_TYPE


def artifact_response(file: ArtifactFile) -> FileResponse:
    """The file as an attachment named after the artifact (see the module docstring for the policy)."""
    response = FileResponse(file.path.open("rb"), as_attachment=True,
                            filename=PurePosixPath(file.artifact.path).name or "artifact",
                            content_type=artifact_content_type(file.artifact.content_type))
    response["X-Content-Type-Options"] = "nosniff"
    return response
