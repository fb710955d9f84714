"""Stop strings over streamed text: what is safe to send, and where the answer ends.

With tools, a stop string ends the answer's free text but never a call: from a
call's opening tag to the closing tag that ends its JSON, the text is the call's
(a city may be "Paris. Done"), and a stop string inside it is just text.
"""

import json

from tiny_llm_base.tool_prompts import CLOSE, OPEN


class StopStrings:
    """Feed the answer's text piece by piece; get back what may be sent now.

    A stop string may arrive split over several pieces, so the tail that could be
    the start of one is held back until the next piece settles it. Once a stop
    string appears, the text before it is the last thing returned, `stopped` is
    set and `found` is that string (the first to appear): the request is then
    aborted and finishes with "stop". calls: the answer may hold tool calls, where
    stop strings do not apply (an OPEN before any stop string starts one).
    """

    def __init__(self, stops: list[str], calls: bool = False):
        self.stops = stops
        self.marks = [*stops, OPEN] if calls else stops  # what a tail may begin
        self.calls = calls
        self.call: str | None = None  # the call in progress, from its OPEN
        self.held = ""
        self.stopped = False
        self.found: str | None = None

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        self.held += text
        ready = ""
        while self.held:
            if self.call is not None:
                ready += self.read_call()
                continue
            found = [(i, s) for s in self.stops if (i := self.held.find(s)) >= 0]
            opened = self.held.find(OPEN) if self.calls else -1
            if opened >= 0 and (not found or opened <= min(found)[0]):
                ready, self.held = ready + self.held[:opened], self.held[opened:]
                self.call = ""
                continue
            if found:
                at, self.found = min(found)
                self.stopped = True
                ready, self.held = ready + self.held[:at], ""
                return ready
            keep = self.longest_partial_stop()
            ready += self.held[: len(self.held) - keep]
            self.held = self.held[len(self.held) - keep :]
            break
        return ready

    def read_call(self) -> str:
        """Move the held text into the call in progress and return it (a call's
        text is sent as it comes); what follows the call's end stays held."""
        text = self.call + self.held
        end = call_end(text)
        if end is None:
            ready, self.call, self.held = self.held, text, ""
            return ready
        ready = self.held[: end - len(self.call)]
        self.call, self.held = None, text[end:]
        return ready

    def flush(self) -> str:
        """The held-back tail, once no more text will come."""
        ready, self.held = self.held, ""
        return ready

    def longest_partial_stop(self) -> int:
        """Length of the longest end of `held` that begins some stop string (or,
        with calls, the opening tag)."""
        for length in range(
            min(len(self.held), max(map(len, self.marks), default=0)), 0, -1
        ):
            tail = self.held[-length:]
            if any(mark.startswith(tail) for mark in self.marks):
                return length
        return 0


def call_end(text: str) -> int | None:
    """`text` starts with OPEN: the index past the CLOSE that ends its call (the
    first CLOSE after a whole JSON object), or None while there is none."""
    end = len(OPEN)
    while (end := text.find(CLOSE, end)) >= 0:
        try:
            json.loads(text[len(OPEN) : end])
            return end + len(CLOSE)
        except json.JSONDecodeError:
            end += len(CLOSE)
    return None
