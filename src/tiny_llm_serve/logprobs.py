"""Log-probabilities in OpenAI's shapes, from the engine's TokenLogprobs.

Chat: `choices[i].logprobs.content`, one entry per token: its text, logprob, UTF-8
`bytes` and `top_logprobs` (the top_logprobs most likely tokens, each with its text,
logprob and bytes). Completions: `choices[i].logprobs` with four lists, one item per
token: `tokens` (texts), `token_logprobs`, `top_logprobs` ({text: logprob} of the
`logprobs` most likely tokens and the token itself, as OpenAI's legacy API and vLLM
give it) and `text_offset` (where the token starts in the choice's text). With
echo the prompt's tokens come first; its first token has no position before it,
so its logprob and top_logprobs are null.

A token's bytes are exact even where it holds part of a character (byte-level
BPE); its text is those bytes as UTF-8, with \\x escapes for bytes that are not
whole characters.
"""

import codecs
import math
import weakref

from tiny_llm_base import TokenLogprob

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer

# GPT-2's byte-level BPE spells each byte as one printable character: the 188
# printable Latin-1 bytes as themselves, the other 68 as chr(256 + n) in order.
PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
BYTE_OF = {chr(b): b for b in PRINTABLE} | {
    chr(256 + n): b
    for n, b in enumerate(b for b in range(256) if b not in set(PRINTABLE))
}
FLOOR = -9999.0  # OpenAI's logprob for a token with no probability (JSON has no -inf)


class TokenTexts:
    """Each token's bytes and text, for one tokenizer (cached as they are asked).
    drops_first_space: the tokenizer's streaming detokenizer (mlx-lm's BPE one, its
    SentencePiece one by default) drops the space a text starts with."""

    def __init__(self, tokenizer):
        self.hf = getattr(tokenizer, "_tokenizer", tokenizer)
        detokenizer = tokenizer.detokenizer
        self.byte_level = isinstance(detokenizer, BPEStreamingDetokenizer)
        self.sentencepiece = isinstance(detokenizer, SPMStreamingDetokenizer)
        self.drops_first_space = self.byte_level or (
            self.sentencepiece and detokenizer.trim_space
        )
        self.special = set(getattr(self.hf, "all_special_ids", ()))
        self.known: dict[int, bytes] = {}

    def spells_first_space(self, tokens: list[int]) -> bool:
        """Do an answer's first tokens, those up to its first text, spell a space
        there that the streaming detokenizer dropped?"""
        spelled = b"".join(self.bytes(token) for token in tokens)
        return self.drops_first_space and spelled.startswith(b" ")

    def bytes(self, token: int) -> bytes:
        if token not in self.known:
            self.known[token] = self.spell(token)
        return self.known[token]

    def spell(self, token: int) -> bytes:
        piece = self.hf.convert_ids_to_tokens(token)
        if piece is None:
            return b""
        if token in self.special:
            return piece.encode()
        if self.byte_level and all(c in BYTE_OF for c in piece):
            return bytes(BYTE_OF[c] for c in piece)
        if self.sentencepiece:
            if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
                return bytes([int(piece[3:5], 16)])
            return piece.replace("\u2581", " ").encode()
        return self.hf.decode([token]).encode()

    def text(self, token: int) -> str:
        return self.bytes(token).decode("utf-8", errors="backslashreplace")


_texts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_texts(tokenizer) -> TokenTexts:
    """The TokenTexts of `tokenizer`, made once per tokenizer."""
    if tokenizer not in _texts:
        _texts[tokenizer] = TokenTexts(tokenizer)
    return _texts[tokenizer]


def finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else FLOOR


def chat_logprobs(entries: list[TokenLogprob], texts: TokenTexts) -> dict:
    """Chat's choice.logprobs for these tokens: {"content": [...]}."""

    def described(token: int, logprob: float) -> dict:
        spelled = texts.bytes(token)
        return {
            "token": texts.text(token),
            "logprob": finite(logprob),
            "bytes": list(spelled),
        }

    return {
        "content": [
            described(entry.token, entry.logprob)
            | {"top_logprobs": [described(t, lp) for t, lp in entry.top]}
            for entry in entries
        ]
    }


class CompletionLogprobs:
    """One completion choice's logprobs, part after part (a stream sends each
    part with its text): text_offset counts the characters of the tokens before."""

    def __init__(self, texts: TokenTexts):
        self.texts = texts
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.characters = 0

    def part(self, tokens: list[int], entries: list[TokenLogprob | None]) -> dict:
        """The logprobs object of `tokens`, entries[i] being token i's (None: the
        prompt's first token, which has none)."""
        texts, part = (
            self.texts,
            {
                "tokens": [],
                "token_logprobs": [],
                "top_logprobs": [],
                "text_offset": [],
            },
        )
        for token, entry in zip(tokens, entries):
            part["tokens"].append(texts.text(token))
            part["text_offset"].append(self.characters)
            self.characters += len(self.decoder.decode(texts.bytes(token)))
            if entry is None:
                part["token_logprobs"].append(None)
                part["top_logprobs"].append(None)
                continue
            top = {texts.text(t): finite(lp) for t, lp in entry.top}
            top.setdefault(texts.text(token), finite(entry.logprob))
            part["token_logprobs"].append(finite(entry.logprob))
            part["top_logprobs"].append(top)
        return part
