"""An answer's tool calls, read out of its text: whole, or as a stream goes.

The calls are read by the package's parse_tool_calls (week 4 day 2); under the
tool-call grammar every call parses. Each is the package's ToolCall (.name, and
.arguments, a dict); every API writes them in its own shape (OpenAI's
tool_calls, the Responses API's function_call items, Anthropic's tool_use
blocks). A stream holds back text from an opening tag until its call is
complete, so a client never sees a call's raw text as content, and gets each call
whole.
"""

from collections.abc import Callable

from tiny_llm_base.tool_prompts import CLOSE, OPEN


def split_calls(text: str, parse: Callable) -> tuple[str, list]:
    """A finished answer -> (its content, its calls). With calls, the content is
    the text before the first one, stripped ("" when there is none). A call the
    answer opened but never closed (cut at max_tokens) is not content, with or
    without calls before it, as in a stream (CallSplitter.flush)."""
    content, calls = parse(text)
    if not calls:
        return text.partition(OPEN)[0], []
    return content.partition(OPEN)[0].strip(), calls


def finish_reason(reason: str, called: bool) -> str:
    """OpenAI's "tool_calls" when the model called and then stopped by itself; an
    answer cut at max_tokens stays "length"."""
    return "tool_calls" if called and reason == "stop" else reason


class CallSplitter:
    """Feeds a streamed answer's pieces; gives back the text that is surely content
    and the calls completed, holding back a possible call until it closes."""

    def __init__(self, parse: Callable):
        self.parse = parse
        self.buffer = ""
        self.calls = 0

    def feed(self, piece: str) -> tuple[str, list]:
        self.buffer += piece
        text, calls = "", []
        while (start := self.buffer.find(OPEN)) >= 0:
            read = self.whole_call(start)
            if read is None:
                break
            end, found = read
            text += self.buffer[:start]
            calls += found
            self.buffer = self.buffer[end:]
        if OPEN not in self.buffer:
            held = max(
                (n for n in range(1, len(OPEN)) if self.buffer.endswith(OPEN[:n])),
                default=0,
            )
            text += self.buffer[: len(self.buffer) - held]
            self.buffer = self.buffer[len(self.buffer) - held :]
        self.calls += len(calls)
        if self.calls and not text.strip():
            text = ""  # the newlines between calls
        return text, calls

    def whole_call(self, start: int) -> tuple[int, list] | None:
        """(the index past the first CLOSE after `start` whose block is a call, the
        calls), or None while no CLOSE ends one: a CLOSE inside an argument's string
        ends no call, and the grammar always closes the call later."""
        end = start
        while (end := self.buffer.find(CLOSE, end)) >= 0:
            end += len(CLOSE)
            _, found = self.parse(self.buffer[start:end])
            if found:
                return end, found
        return None

    def flush(self) -> str:
        """The text held back when the answer ended: a call it opened but never
        closed (cut at max_tokens) is not content."""
        rest, self.buffer = self.buffer.partition(OPEN)[0], ""
        return "" if self.calls and not rest.strip() else rest
