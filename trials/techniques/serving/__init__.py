"""Serving under load: each stack behind a real server, driven by open-loop traffic."""
