"""The user-facing commands behind `pdm run`: main, serve, book, tests, load test."""
