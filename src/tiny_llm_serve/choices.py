"""One choice of an OpenAI answer, as the generation routes write it, whole or
piece by piece: the prompt first with echo (completions), tool calls split out of
the text (chat with tools), and the logprobs of its tokens (logprobs.py).

A request with n choices has n of these, one per choice index; each keeps its own
stream state (a tool call held back until it closes, the completions logprobs'
running text_offset).
"""

from .generation import Ending, Generation, Piece
from .logprobs import CompletionLogprobs, chat_logprobs, token_texts
from .openai_objects import choice_object
from .request import GenerationRequest
from .state import ServerState
from .tool_answers import CallSplitter, finish_reason, whole_message


def joined(first: dict | None, second: dict | None) -> dict | None:
    """Two completions logprobs parts as one (either may be None)."""
    if first is None or second is None:
        return first or second
    return {key: first[key] + second[key] for key in first}


class ChoiceWriter:
    """Choice `index` of `request`'s answer."""

    def __init__(
        self,
        request: GenerationRequest,
        generation: Generation,
        server: ServerState,
        index: int,
    ):
        self.request, self.generation, self.index = request, generation, index
        self.tokenizer = server.engine.tokenizer
        self.texts = token_texts(self.tokenizer)
        self.parse = server.constraints.parse_tool_calls
        self.splitter = CallSplitter(self.parse)
        self.completion_logprobs = CompletionLogprobs(self.texts)
        self.echo_due = request.echo
        self.called = False
        self.text, self.entries = "", []  # a whole answer's, gathered
        self.ending: Ending | None = None

    def take_echo(self) -> tuple[str, dict | None]:
        """The prompt's text and (completions with logprobs) its logprobs part, the
        first time this is asked with echo on; else ("", None)."""
        if not self.echo_due:
            return "", None
        self.echo_due = False
        generation, prompt = self.generation, self.request.prompt
        ids = generation.prompt_ids
        text = prompt if isinstance(prompt, str) else self.tokenizer.decode(ids)
        if self.request.logprobs is None:
            return text, None
        entries = generation.prompt_logprobs or [None] * len(ids)
        return text, self.completion_logprobs.part(ids, entries)

    def logprobs(self, entries: list) -> dict | None:
        """The logprobs object of these tokens, None when none were asked."""
        if self.request.logprobs is None:
            return None
        if self.request.endpoint == "chat":
            return chat_logprobs(entries, self.texts)
        return self.completion_logprobs.part([e.token for e in entries], entries)

    def gather(self, piece: Piece) -> None:
        """A whole answer's piece."""
        self.text += piece.text
        self.entries += piece.logprobs
        self.ending = piece.ending or self.ending

    def whole(self) -> dict:
        """The gathered answer's choice object."""
        echo, echo_logprobs = self.take_echo()
        text, calls = self.text, []
        if self.request.tools:
            text, calls = whole_message(text, self.parse)
        reason = finish_reason(self.ending.reason, bool(calls))
        if self.request.endpoint == "chat":
            logprobs = self.logprobs(self.entries)
        else:
            logprobs = joined(echo_logprobs, self.logprobs(self.entries))
        content = echo + text if echo else text
        return choice_object(self.request, self.index, content, reason, calls, logprobs)

    def streamed(self, piece: Piece) -> list[dict]:
        """A streamed piece as (text, tool_calls, finish_reason, logprobs) chunk
        fields, in the order to send them (chunk_object's keywords)."""
        echo, echo_logprobs = self.take_echo()
        text, calls = piece.text, []
        if self.request.tools:
            text, calls = self.splitter.feed(text)
            text += self.splitter.flush() if piece.ending is not None else ""
        logprobs = self.logprobs(piece.logprobs) if piece.logprobs else None
        if self.request.endpoint == "completion":
            logprobs = joined(echo_logprobs, logprobs)
        chunks = []
        if echo + text or logprobs:
            chunks.append({"text": echo + text, "logprobs": logprobs})
        if calls:
            self.called = True
            chunks.append({"text": "", "tool_calls": calls})
        if piece.ending is not None:
            reason = finish_reason(piece.ending.reason, self.called)
            chunks.append({"text": "", "finish_reason": reason})
        return chunks
