"""How a choice ended, in the words of OpenAI's finish_reason: decided here only."""


def finish_reason(
    engine_reason: str, stopped_by_string: bool, called: bool = False
) -> str:
    """OpenAI's finish_reason of a choice the engine finished with `engine_reason`.
    A full slot ("max_seq_len") is "length"; an abort the server made for a stop
    string is "stop"; "stop" after tool calls (the model called, then stopped by
    itself) is "tool_calls". An answer cut at max_tokens stays "length"."""
    if engine_reason == "abort" and stopped_by_string:
        return "stop"
    if engine_reason == "max_seq_len":
        return "length"
    return "tool_calls" if called and engine_reason == "stop" else engine_reason
