"""One choice of an OpenAI answer in OpenAI's shapes, whole or chunk by chunk:
the prompt first with echo (completions), the tool calls answers.py split out of
the text as tool_calls entries (chat with tools), and the logprobs of its tokens
(logprobs.py).

A request with n choices has n of these, one per choice index; each keeps its own
stream state (the tool calls sent so far, the completions logprobs' running
text_offset).
"""

from .answers import Answer, Part
from .generation import Generation
from .logprobs import CompletionLogprobs, chat_logprobs, token_texts
from .openai_objects import call_objects, choice_object
from .request import GenerationRequest
from .state import ServerState


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
        self.completion_logprobs = CompletionLogprobs(self.texts)
        self.echo_due = request.echo
        self.calls_sent = 0

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

    def whole(self, answer: Answer) -> dict:
        """The choice object of this choice's whole answer."""
        echo, echo_logprobs = self.take_echo()
        text = (answer.text or None) if answer.calls else answer.text
        if self.request.endpoint == "chat":
            logprobs = self.logprobs(answer.logprobs)
        else:
            logprobs = joined(echo_logprobs, self.logprobs(answer.logprobs))
        content = echo + text if echo else text
        calls = call_objects(answer.calls)
        return choice_object(
            self.request, self.index, content, answer.reason, calls, logprobs
        )

    def streamed(self, part: Part) -> list[dict]:
        """A streamed Part of this choice as (text, tool_calls, finish_reason,
        logprobs) chunk fields, in the order to send them (chunk_object's
        keywords)."""
        echo, echo_logprobs = self.take_echo()
        logprobs = self.logprobs(part.logprobs) if part.logprobs else None
        if self.request.endpoint == "completion":
            logprobs = joined(echo_logprobs, logprobs)
        chunks = []
        if echo + part.text or logprobs:
            chunks.append({"text": echo + part.text, "logprobs": logprobs})
        if part.calls:
            calls = call_objects(part.calls, self.calls_sent)
            self.calls_sent += len(calls)
            chunks.append({"text": "", "tool_calls": calls})
        if part.ending is not None:
            chunks.append({"text": "", "finish_reason": part.reason})
        return chunks
