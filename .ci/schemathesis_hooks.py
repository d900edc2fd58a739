"""Hooks of .ci/schemathesis (loaded through SCHEMATHESIS_HOOKS). Both change a request
after generation and keep it within what the document says, so every check still judges
the request as generated (valid or not).

1. The store agent's long poll answers after `wait_ms` (default 25 s, at most 60 s) when
   there is no work, as the contract says; a fuzzer drawing long waits would spend its
   whole time budget waiting. Waits are cut to at most 200 ms.
2. The run's own credentials stay alive. The fuzzer reads credential ids in answers
   (`GET /v1/api-keys`, an agent token list, `GET /v1/operators`) and revokes them; a
   revoked tenant key, agent token or operator token would turn the rest of the run into
   401s. Such a revocation is pointed at a spare credential seeded for the purpose (the
   same operation, the same kind of object, answered the same way). Logging out
   (`DELETE /v1/operator-sessions`) ends the operator token, which only that operation
   uses; it answers 401 afterwards, as documented.

And one repair of the pinned schemathesis itself: 4.32.5 scans 2xx JSON answers for
same-origin URLs to learn links, and its `urlsplit` raises on a string such as
`http://[0` (an unclosed IPv6 host), which ends the whole run with an internal error. A
submission answer echoes the `biz_no` it was sent, and the fuzzer draws such strings, so
the scan treats a string it cannot parse as no URL, which is what it is.
"""

import os

import schemathesis
from schemathesis.engine import observations as _observations

_same_origin_path = _observations._same_origin_path


def _same_origin_path_or_none(value, origin):
    try:
        return _same_origin_path(value, origin)
    except ValueError:
        return None


_observations._same_origin_path = _same_origin_path_or_none

LONGEST_WAIT_MS = 200

# The credential in use -> the spare one revoked instead.
SPARE_PATH_IDS = {
    ("DELETE", "/v1/api-keys/{id}", "id"): (os.environ.get("ST_TENANT_KEY_ID"), os.environ.get("ST_SPARE_KEY_ID")),
    ("DELETE", "/v1/stores/{id}/agent-tokens/{token_id}", "token_id"): (
        os.environ.get("ST_AGENT_TOKEN_ID"),
        os.environ.get("ST_SPARE_AGENT_TOKEN_ID"),
    ),
    ("DELETE", "/v1/operators/{id}/sessions", "id"): (
        os.environ.get("ST_OPERATOR_ID"),
        os.environ.get("ST_SPARE_OPERATOR_ID"),
    ),
}


@schemathesis.hook
def before_call(context, case, **kwargs):
    operation = case.operation
    if operation.path == "/v1/agent/poll" and isinstance(case.body, dict):
        wait = case.body.get("wait_ms")
        # bool is an int in Python; a `true` drawn on purpose stays as it is.
        # Integers and numbers with a zero fraction (`1.0` is an integer to JSON Schema).
        drawn = isinstance(wait, (int, float)) and not isinstance(wait, bool)
        if wait is None or (drawn and wait > LONGEST_WAIT_MS):
            case.body["wait_ms"] = LONGEST_WAIT_MS
    for (method, path, name), (in_use, spare) in SPARE_PATH_IDS.items():
        if operation.method.upper() == method and operation.path == path and case.path_parameters:
            if in_use and case.path_parameters.get(name) == in_use:
                case.path_parameters[name] = spare
