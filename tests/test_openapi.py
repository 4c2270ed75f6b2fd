"""The OpenAPI spec at /openapi.json stays true: its paths and methods are the app's routes, its
schemas are valid JSON Schema, real responses match them, and schemathesis, run against a live
server for a bounded time, finds no server error and no response that violates the spec."""
import os
import re
import subprocess
import sys

import pytest
from jsonschema import Draft202012Validator
from server_process import API_KEY, API_MODEL, REPO, api_server

from webapp import create_app
from webapp.openapi import openapi_spec

SCHEMATHESIS_SECONDS = int(os.environ.get("PYENGINE_SCHEMATHESIS_SECONDS", "75"))


def _never_loads():
    raise RuntimeError("no model in this test")


def test_spec_paths_are_the_apps_routes():
    app = create_app(llm_factory=_never_loads, on_load_error=lambda exc: None)
    routes = {}
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)
        routes.setdefault(path, set()).update(m.lower() for m in rule.methods
                                              if m not in ("HEAD", "OPTIONS"))
    spec = openapi_spec()
    documented = {path: {m for m in ops if m != "parameters"}
                  for path, ops in spec["paths"].items()}
    assert documented == routes


def test_spec_schemas_are_valid_json_schema():
    spec = openapi_spec()
    assert spec["openapi"].startswith("3.1")
    for schema in spec["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)


@pytest.fixture(scope="module")
def server():
    return api_server()


def response_validator(spec: dict, path: str, method: str, status: int, content_type: str):
    response = spec["paths"][path][method]["responses"][str(status)]
    schema = response["content"][content_type]["schema"]
    # The components ride along in the document, so "#/components/..." references resolve.
    return Draft202012Validator({**schema, "components": spec["components"]})


def test_served_spec_states_the_model_and_real_answers_match_it(server):
    resp = server.get("/openapi.json")
    assert resp.status_code == 200
    spec = resp.json()
    params = spec["paths"]["/v1/models/{model_id}"]["parameters"]
    assert params[0]["example"] == API_MODEL
    chat = spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert chat["max_tokens"]["anyOf"][0]["maximum"] == 511  # --max_model_len 512
    assert set(chat["chat_template_kwargs"]["anyOf"][0]["properties"]) == {"enable_thinking"}
    cases = [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                  "max_tokens": 3, "logprobs": True, "top_logprobs": 2}, 200),
        ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 2, "logprobs": 1}, 200),
        ("/v1/chat/completions", {"messages": []}, 400),
        ("/v1/completions", {"prompt": "a", "model": "nope"}, 404),
    ]
    for path, body, status in cases:
        resp = server.post(path, json=body, timeout=60)
        assert resp.status_code == status, resp.text
        response_validator(spec, path, "post", status, "application/json").validate(resp.json())
    for path in ("/v1/models", f"/v1/models/{API_MODEL}", "/v1/capacity", "/v1/stats"):
        resp = server.get(path)
        response_validator(spec, path.replace(API_MODEL, "{model_id}"), "get", 200,
                           "application/json").validate(resp.json())
    resp = server.get("/v1/models/nope")
    response_validator(spec, "/v1/models/{model_id}", "get", 404,
                       "application/json").validate(resp.json())


def test_schemathesis_finds_no_server_error_and_no_spec_violation(server):
    """Examples, coverage (boundary values), fuzzing and stateful phases, positive and negative
    data, every check but positive_data_acceptance (a request valid by its shape may still be
    refused for what no schema can say: its length in tokens, prompts x n)."""
    cmd = [sys.executable, "-m", "schemathesis.cli", "--config-file",
           str(REPO / "tests" / "schemathesis.toml"), "run", server.url + "/openapi.json",
           "-H", f"Authorization: Bearer {API_KEY}", "--seed", "1", "--workers", "1",
           "--max-time", str(SCHEMATHESIS_SECONDS), "--request-timeout", "60", "--no-color",
           "--exclude-checks", "positive_data_acceptance", "--generation-database", "none"]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO / "tests" / "artifacts",
                         timeout=SCHEMATHESIS_SECONDS + 240)
    out = run.stdout + run.stderr
    (REPO / "tests" / "artifacts" / "schemathesis.log").write_text(out)
    summary = out[out.rfind("SUMMARY"):]
    print(summary)
    assert run.returncode == 0, out[-6000:]
    tested = re.search(r"(\d+) generated, (\d+) passed", summary)
    assert tested and int(tested.group(1)) >= 200 and tested.group(1) == tested.group(2), summary
    assert "No issues found" in summary
