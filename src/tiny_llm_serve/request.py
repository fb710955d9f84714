"""What the engine side needs of a request, whichever API's body it came in.

Each API's body model (openai_bodies.py) turns itself into a GenerationRequest once it is
checked; generation.py runs one on the engine. A new API (another route module)
only needs its body to say the same: a prompt, the answer's limits, its sampling
and at most one constraint.
"""

from dataclasses import dataclass, field

from tiny_llm_base import SamplingOptions


@dataclass(frozen=True)
class ConstraintRequest:
    """A structured-output option as the body gave it. kind: "json_schema" (value a
    schema object), "json_object" (value None), "regex" (a pattern), "choice" (a
    list of strings) or "tools" (value (tools, tool_choice, parallel_tool_calls):
    week 4 day 2's tool-call grammar); param: the field to name in an error."""

    kind: str
    value: object
    param: str


@dataclass
class GenerationRequest:
    """One checked request. Exactly one of `messages` (chat: role and text content,
    as the chat template takes them) and `prompt` (completion: text, or token ids
    used as they are) is set.

    tools: OpenAI's function tools offered to the model (chat), rendered by the chat
    template; the answer's calls are parsed out of its text.
    max_tokens None: until the context is full; 0 (with echo): nothing is
    generated, the prompt is scored. top_k None: no limit. stop: strings that end
    the answer where they first appear (not included in it). priority: the engine's
    queue, "interactive" or "batch". n: choices to generate. options: the engine's
    SamplingOptions (logprobs, seed, penalties...), None when nothing is asked.
    echo: the answer starts with the prompt (completions).
    """

    endpoint: str  # "chat" or "completion"
    model: str | None
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    tools: list[dict] | None = None
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    priority: str = "batch"
    constraint: ConstraintRequest | None = None
    n: int = 1
    options: SamplingOptions | None = None
    echo: bool = False

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def logprobs(self) -> int | None:
        """Top logprobs per token asked (None: no logprobs)."""
        return None if self.options is None else self.options.logprobs
