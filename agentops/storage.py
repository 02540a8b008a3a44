"""Central storage of artifacts, through Django's storage API (``storages["artifacts"]``).

The sandbox host that captured a file uploads it here, so a download never needs the host. The
default is the filesystem under ``AGENTOPS_ARTIFACT_ROOT`` (read on every use: tests and one-off
commands change it); ``AGENTOPS_ARTIFACT_STORAGE`` names any django-storages backend instead.
"""

import os

from django.conf import settings
from django.core.files.storage import FileSystemStorage


class ArtifactStorage(FileSystemStorage):
    @property
    def base_location(self) -> str:
        return str(settings.AGENTOPS_ARTIFACT_ROOT)

    @property
    def location(self) -> str:
        return os.path.abspath(self.base_location)
