"""What the engine side needs of a request, whichever API's body it came in.

Each API's body model (openai_bodies.py, responses_bodies.py, anthropic_bodies.py)
turns itself into a GenerationRequest once it is checked; generation.py runs one on
the engine. A new API (another route module) only needs its body to say the same:
a prompt, the answer's limits, its sampling and at most one constraint.
"""

from dataclasses import dataclass, field

from tiny_llm_base import SamplingOptions


@dataclass(frozen=True)
class ConstraintRequest:
    """A structured-output option as the body gave it. kind: "json_schema" (value a
    schema object), "json_object" (value None), "regex" (a pattern), "choice" (a
    list of strings) or "tools" (value (tools, tool_choice, parallel_tool_calls)
    in the chat's shapes: week 4 day 2's tool-call grammar); param: the field to
    name in an error. renames: (chat's name, the body's) pairs for the package's
    messages, which name the chat's fields (tools[0].function.parameters) where
    another API's body has its own (tools[0].input_schema). answer_format: with
    tools, the JSON format ("json_schema" or "json_object") an answer without calls
    must follow (response_format beside tools: the answer is calls or that JSON)."""

    kind: str
    value: object
    param: str
    renames: tuple[tuple[str, str], ...] = ()
    answer_format: "ConstraintRequest | None" = None

    @property
    def cuts_whole(self) -> bool:
        """A stop string would cut what this constraint promises whole: anything
        but tools alone, whose calls the stop strings spare (stop_strings.py)."""
        return self.kind != "tools" or self.answer_format is not None

    def worded(self, message: str) -> str:
        """A message about this option in the body's own field names."""
        for chat_name, own_name in self.renames:
            message = message.replace(chat_name, own_name)
        return message


@dataclass
class GenerationRequest:
    """One checked request. Exactly one of `messages` (chat and the APIs made into
    chats: role and text content, as the chat template takes them) and `prompt`
    (completion: text, or token ids used as they are) is set.

    tools: OpenAI's function tools offered to the model (chat), rendered by the chat
    template; the answer's calls are parsed out of its text.
    include_usage: a stream ends with a usage chunk; continuous_usage: every chunk
    carries usage too (vLLM's stream_options.continuous_usage_stats).
    max_tokens None: until the context is full; 0 (with echo): nothing is
    generated, the prompt is scored. top_k None: no limit. stop: strings that end
    the answer where they first appear (not included in it). priority: the engine's
    queue, "interactive" or "batch". fit_to_context: a max_tokens past what the
    context leaves after the prompt is cut to it (the Messages API's rule) instead
    of refused. n: choices to generate (chat and completions; the other endpoints
    take one). options: the engine's SamplingOptions (logprobs, seed,
    penalties...), None when nothing is asked. echo: the answer starts with the
    prompt (completions). max_calls: the calls an answer returns at most (the
    Responses API's max_tool_calls); the model's further calls are ignored, as
    OpenAI documents it. prefill: the last message is the start of the
    assistant's answer, which the model continues (the Messages API's prefill):
    the prompt ends inside it, and the answer is the continuation alone.
    """

    endpoint: str  # "chat", "completion", "responses" or "messages"
    model: str | None
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    tools: list[dict] | None = None
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    priority: str = "batch"
    constraint: ConstraintRequest | None = None
    fit_to_context: bool = False
    n: int = 1
    options: SamplingOptions | None = None
    echo: bool = False
    max_calls: int | None = None
    prefill: bool = False

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def prompt_param(self) -> str:
        """The body's field holding the prompt, for an error about its length."""
        return {"completion": "prompt", "responses": "input"}.get(
            self.endpoint, "messages"
        )

    @property
    def limit_param(self) -> str:
        """The body's field for the answer's length."""
        return "max_output_tokens" if self.endpoint == "responses" else "max_tokens"

    @property
    def logprobs(self) -> int | None:
        """Top logprobs per token asked (None: no logprobs)."""
        return None if self.options is None else self.options.logprobs
