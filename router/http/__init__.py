"""The router's lean HTTP/1.1 data plane: server (server.py), ASGI bridge (asgi.py), replica client (upstream.py)."""
