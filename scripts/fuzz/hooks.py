"""Schemathesis checks of our own (loaded through SCHEMATHESIS_HOOKS by scripts/fuzz-api)."""

import json

import schemathesis


@schemathesis.check
def json_error_body(ctx, response, case):
    """Every 4xx and 5xx answers {"error": code, "message": text} as JSON."""
    if response.status_code < 400:
        return None
    content_type = response.headers.get("content-type", [""])
    if isinstance(content_type, list):
        content_type = content_type[0] if content_type else ""
    if not content_type.startswith("application/json"):
        raise AssertionError(
            f"{response.status_code} answered with content-type {content_type!r}, not JSON"
        )
    try:
        body = json.loads(response.content)
    except ValueError as e:
        raise AssertionError(f"{response.status_code} body is not JSON: {e}") from e
    if response.status_code == 503 and case.path == "/readyz":
        return None
    if not (
        isinstance(body, dict)
        and isinstance(body.get("error"), str)
        and isinstance(body.get("message"), str)
    ):
        raise AssertionError(
            f"{response.status_code} body is not {{error, message}}: {body!r}"
        )
    return None
