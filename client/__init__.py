"""corral.client: the Python SDK and the corral CLI."""
