"""JSON responses encoded with orjson, numpy arrays included.

FastAPI runs ``jsonable_encoder`` over a returned dict, element by element, before encoding; for
a 1280-float embedding that costs more than the model call. Routes that return vectors build a
:class:`FastJSONResponse` themselves, which skips that walk and encodes arrays natively.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import JSONResponse

__all__ = ["FastJSONResponse"]

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


class FastJSONResponse(JSONResponse):
    """``application/json`` via orjson (numpy arrays serialised as lists)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=_OPTIONS)
