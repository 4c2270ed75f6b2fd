"""The OpenAI-compatible HTTP server and the web chat page (Flask, served by gunicorn)."""
from webapp.app import create_app

__all__ = ["create_app"]
