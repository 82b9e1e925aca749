"""`/docs`: Swagger UI served from the installed `swagger-ui-bundle-v2` package, so the page
works with no network (FastAPI's own `/docs` loads Swagger UI from a CDN and stays blank
offline; its `/redoc` likewise, so the app turns both off)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"

DESCRIPTION = """Retrieval over a tkg store: search, context, fact history, entities.

**API key.** A server started with `--keys` needs a key on every request, as
`Authorization: Bearer tkg_...` or `X-API-Key: tkg_...` (create one with
`tkg keys add --keys FILE --name NAME --group G`). A key reads its own groups only:
naming another group is 403, with the same answer whether or not that group exists.

**Groups.** `POST /search` and `POST /context` name them in the body (`group_ids`);
`GET /facts/{edge_id}/history` and `GET /entities/{entity_id}` take the query parameter
`group_id` (repeatable). With a key and none named, each reads every group the key may
read; without keys they must be named.

**Examples**, with `TKG_URL` the address `tkg serve` printed when it started
(`http://127.0.0.1:PORT`, the port of its `--port`):

    curl -H "Authorization: Bearer $KEY" "$TKG_URL/search" \\
         -H "Content-Type: application/json" -d '{"query": "Where does Dana live?"}'
    curl -H "Authorization: Bearer $KEY" "$TKG_URL/facts/$EDGE/history?group_id=acme"
    curl -H "X-API-Key: $KEY" "$TKG_URL/entities/$ENTITY?group_id=acme"
"""


def add_docs(app: FastAPI) -> None:
    """Swagger UI at `/docs` with its assets under `/docs/assets` (create the app with
    `docs_url=None, redoc_url=None`)."""
    import swagger_ui_bundle

    app.mount(ASSETS, StaticFiles(directory=swagger_ui_bundle.swagger_ui_path),
              name="docs-assets")

    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
            # (no badge from the public validator service: it would call out)
            swagger_ui_parameters={"validatorUrl": None})

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
