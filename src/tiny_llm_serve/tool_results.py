"""A tool result must answer a call the conversation made before it.

Each API gives an earlier call an id (chat: an assistant message's
tool_calls[].id; Responses: a function_call item's call_id; Messages: an assistant
tool_use block's id) and its result the same id (a tool message's tool_call_id, a
function_call_output item's call_id, a user tool_result block's tool_use_id). A
result whose id no earlier call has answers nothing the model asked: OpenAI's and
Anthropic's APIs refuse it, and so does this server, naming the field and the id.

Each API's body lists its conversation's calls and results in order, a call as
(id, None) and a result as (id, the body's path to that id), and
refuse_unasked_results reads the list.
"""

from collections.abc import Iterable, Iterator

from .errors import short
from .validation import Refusal

# A call (its id, None) or a result (its id, the body's path to the id).
CallOrResult = tuple[str | None, str | None]


def refuse_unasked_results(conversation: Iterable[CallOrResult]) -> None:
    """A Refusal of the first result whose id no call before it has."""
    asked = set()
    for call_id, result_path in conversation:
        if result_path is None:
            asked.add(call_id)
        elif call_id not in asked:
            raise Refusal(
                f"is {short(call_id)}, which answers no call: no call before it has "
                "that id. Send each tool result with the id of the call it answers, "
                "after the assistant message that made the call",
                field=result_path,
            )


def chat_calls_and_results(messages: list) -> Iterator[CallOrResult]:
    """A chat's: the assistant messages' tool_calls, the tool messages."""
    for i, message in enumerate(messages):
        for call in message.tool_calls or []:
            yield call.id, None
        if message.role == "tool":
            yield message.tool_call_id, f"messages[{i}].tool_call_id"


def responses_calls_and_results(items) -> Iterator[CallOrResult]:
    """A Responses input's (a string has none): function_call and
    function_call_output items."""
    for i, item in enumerate([] if isinstance(items, str) else items):
        if item.type == "function_call":
            yield item.call_id, None
        elif item.type == "function_call_output":
            yield item.call_id, f"input[{i}].call_id"


def messages_calls_and_results(messages: list) -> Iterator[CallOrResult]:
    """A Messages API conversation's: tool_use and tool_result blocks."""
    for i, message in enumerate(messages):
        for j, block in enumerate(message.blocks()):
            if block.type == "tool_use":
                yield block.id, None
            elif block.type == "tool_result":
                yield block.tool_use_id, f"messages[{i}].content[{j}].tool_use_id"
