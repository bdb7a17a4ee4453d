"""corral.execd: the in-sandbox daemon."""
