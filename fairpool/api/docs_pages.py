"""The API's documentation pages, ``/docs`` (Swagger UI) and ``/redoc``, served with their
scripts and styles from this server rather than FastAPI's default CDN: a server on a network
without the internet (most clusters that share GPUs) would otherwise show a blank page.

The assets are those the ``fastapi_offline`` package ships (Swagger UI 5, ReDoc 2, MIT); the
pages are FastAPI's own, pointed at them."""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS = "/docs"
REDOC = "/redoc"
ASSETS = DOCS + "/assets"


def serve_docs(app: FastAPI) -> None:
    """Add the documentation pages to ``app``, made with ``docs_url`` and ``redoc_url`` None."""
    assets = files("fastapi_offline") / "static"
    app.mount(ASSETS, StaticFiles(directory=str(assets)), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    redirect_url = app.swagger_ui_oauth2_redirect_url or DOCS + "/oauth2-redirect"

    def at(request: Request, path: str) -> str:
        # Behind a proxy that mounts the server under a prefix, as FastAPI's own pages do.
        return f"{request.scope.get('root_path', '')}{path}"

    @app.get(DOCS, include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=at(request, openapi_url),
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=at(request, redirect_url),
            swagger_js_url=at(request, ASSETS + "/swagger-ui-bundle.js"),
            swagger_css_url=at(request, ASSETS + "/swagger-ui.css"),
            swagger_favicon_url=at(request, ASSETS + "/favicon.png"),
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    @app.get(redirect_url, include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC, include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(
            openapi_url=at(request, openapi_url),
            title=f"{app.title} - ReDoc",
            redoc_js_url=at(request, ASSETS + "/redoc.standalone.js"),
            redoc_favicon_url=at(request, ASSETS + "/favicon.png"),
            with_google_fonts=False,
        )
