"""What the server returns as a tool call is what the request offered: a call that
names an offered tool and whose arguments the client's own schema accepts
(tiny_llm_serve.tool_answers.CallCheck, judged by jsonschema), on the chat,
Responses and Messages APIs, streamed and not.

The package's grammar never writes a bad call, so to see the check work a forged
grammar forces one: the constraint factory of this module's server answers every
tool request with a literal grammar (a call to a tool nobody offered, arguments the
schema refuses, a second call where parallel calls are off), picked by the first
tool's name. Each must fail the request (a 500, or an error event mid-stream)
with no call in the answer. An answer cut by max_tokens inside a call comes back
as the text the model wrote, with finish_reason "length".
"""

import json

import httpx
import pytest

from tiny_llm_base import Grammar
from tiny_llm_base.tool_prompts import OPEN
from tiny_llm_serve import ConstraintFactory
from tiny_llm_serve.tool_answers import CallSplitter, split_calls

from .helpers import call_text
from .servers import API_KEY, CONSTRAINTS, MODEL, package_server
from .solution import tiny

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


# tool name -> (the answer its forged grammar forces, words of the error)
FORGED = {
    "forge_unoffered": (
        "Done. " + call_text("delete_all_files", {"path": "/", "force": True}),
        "names no tool this request offered",
    ),
    "forge_arguments": (
        call_text("forge_arguments", {"city": 123}),
        "fail the tool's schema at $.city",
    ),
    "forge_second": (
        call_text("forge_second", {"city": "Oslo"})
        + "\n"
        + call_text("forge_second", {"city": "Rome"}),
        "parallel_tool_calls is false",
    ),
}


THREE = "\n".join(call_text("forge_three", {"city": c}) for c in ("A", "B", "C"))


def forged_tools(tools, tool_choice, parallel_tool_calls):
    name = tools[0]["function"]["name"]
    answer = THREE if name == "forge_three" else FORGED[name][0]
    return Grammar(f"start: {json.dumps(answer)}\n")


@pytest.fixture(scope="module")
def server(protocol_model):
    factory = ConstraintFactory(
        CONSTRAINTS.regex,
        CONSTRAINTS.choice,
        CONSTRAINTS.start,
        forged_tools,
        CONSTRAINTS.parse_tool_calls,
    )
    # jump-forward: a forged answer is all forced text, verified a chunk a forward
    with package_server(protocol_model, factory, jump_forward=True) as running:
        yield running


def body_of(api: str, name: str, stream: bool) -> tuple[str, dict]:
    """(path, body) of a request offering tool `name` in `api`'s shape, one call at
    most where the API lets the body say so."""
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    common = {"model": MODEL, "max_tokens": 64, "stream": stream, "temperature": 0}
    if api == "chat":
        tool = {"type": "function", "function": {"name": name, "parameters": CITY}}
        body = {"messages": ask, "tools": [tool], "parallel_tool_calls": False}
        return "/v1/chat/completions", common | body
    if api == "responses":
        tool = {"type": "function", "name": name, "parameters": CITY}
        body = {"input": ask, "tools": [tool], "parallel_tool_calls": False}
        common["max_output_tokens"] = common.pop("max_tokens")
        return "/v1/responses", common | body
    tool = {"name": name, "input_schema": CITY}
    choice = {"type": "auto", "disable_parallel_tool_use": True}
    return "/v1/messages", common | {"messages": ask, "tools": [tool]} | {
        "tool_choice": choice
    }


CALL_MARKS = ('"tool_calls"', '"function_call"', '"tool_use"')


# Every API, whole and streamed, for the two forgeries a grammar hole would let
# through; a second call beside parallel_tool_calls false on the chat API.
CASES = [
    (name, api)
    for name in ("forge_unoffered", "forge_arguments")
    for api in ("chat", "responses", "messages")
] + [("forge_second", "chat")]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("name, api", CASES)
def test_a_call_the_request_did_not_offer_is_never_returned(server, api, name, stream):
    path, body = body_of(api, name, stream)
    headers = {"Authorization": f"Bearer {API_KEY}", "x-api-key": API_KEY}
    with httpx.Client(base_url=server.url, headers=headers, timeout=120) as http:
        response = http.post(path, json=body)
    _, words = FORGED[name]
    if not stream:
        assert response.status_code == 500, response.text
        assert words in response.text, response.text
    else:
        assert response.status_code == 200, response.text
        assert words in response.text and "error" in response.text, response.text
    if stream and name == "forge_second":
        # the first call was whole and valid, and went out before the second began
        assert "Rome" not in response.text, response.text
        return
    for mark in CALL_MARKS:
        assert mark not in response.text, (mark, response.text)


def test_a_schema_jsonschema_cannot_read_is_a_400_before_any_work(server):
    tool = {
        "type": "function",
        "function": {
            "name": "forge_arguments",
            "parameters": {"type": "object", "required": 3},
        },
    }
    with httpx.Client(base_url=server.url, timeout=120) as http:
        response = http.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {API_KEY}"},
            json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
            | {"tools": [tool]},
        )
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert message.startswith("tools[0].function.parameters.required is not valid")


# --- a call cut by max_tokens is text ----------------------------------------------

WHOLE = call_text("get_weather", {"city": "Paris"})
CUT_AT = [len(OPEN) - 3, len(OPEN) + 1, len(WHOLE) - 6]


@pytest.mark.parametrize("cut", CUT_AT, ids=["in the tag", "after it", "in the JSON"])
@pytest.mark.parametrize("before", ["", "Let me look. ", WHOLE + "\n"])
def test_a_cut_call_comes_back_as_the_text_the_model_wrote(before, cut):
    """Whole and streamed (a character at a time), the answer `before` + a call cut
    at `cut` keeps the cut text as content and returns only the whole calls."""
    answer = before + WHOLE[:cut]
    content, calls = split_calls(answer, tiny.parse_tool_calls)
    whole_calls = 1 if before == WHOLE + "\n" else 0
    assert len(calls) == whole_calls
    assert content == (WHOLE[:cut] if whole_calls else answer)
    splitter, streamed, found = CallSplitter(tiny.parse_tool_calls), "", []
    for character in answer:
        text, new = splitter.feed(character)
        streamed, found = streamed + text, found + new
    streamed += splitter.flush()
    assert len(found) == whole_calls
    assert streamed.strip() == content.strip()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_max_tool_calls_returns_the_first_calls_and_ignores_the_rest(server, stream):
    """The Responses API's max_tool_calls: the forged answer holds three calls;
    with max_tool_calls 2 the first two come back, as OpenAI documents."""
    tool = {"type": "function", "name": "forge_three", "parameters": CITY}
    client = server.openai_client()
    options = dict(model=MODEL, input="Weather?", tools=[tool], max_output_tokens=200)
    options |= dict(extra_body={"max_tool_calls": 2})
    if not stream:
        output = client.responses.create(**options).output
    else:
        with client.responses.stream(**options) as events:
            output = events.get_final_response().output
    calls = [item for item in output if item.type == "function_call"]
    assert [json.loads(c.arguments)["city"] for c in calls] == ["A", "B"]
