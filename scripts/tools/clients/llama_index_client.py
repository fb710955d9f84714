"""llama-index: OpenAILike (llama-index-llms-openai-like), the class its docs give
for an OpenAI-compatible server: chat and stream_chat."""

from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike

from scripts.tools.clients import ServerAddress

MESSAGES = [
    ChatMessage(role="system", content="You are a pirate with a colorful personality"),
    ChatMessage(role="user", content="What is your name?"),
]


def llm(server: ServerAddress) -> OpenAILike:
    return OpenAILike(
        model=server.model,
        api_base=server.v1,
        api_key=server.api_key,
        is_chat_model=True,
        context_window=2048,
        max_tokens=16,
        max_retries=0,
    )


def chat(server: ServerAddress) -> None:
    response = llm(server).chat(MESSAGES)
    assert response.message.content, response


def stream(server: ServerAddress) -> None:
    pieces = [r.delta for r in llm(server).stream_chat(MESSAGES)]
    assert "".join(p or "" for p in pieces), pieces


FEATURES = {"chat": chat, "stream_chat": stream}
