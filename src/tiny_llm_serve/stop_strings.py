"""Stop strings over streamed text: what is safe to send, and where the answer ends."""


class StopStrings:
    """Feed the answer's text piece by piece; get back what may be sent now.

    A stop string may arrive split over several pieces, so the tail that could be
    the start of one is held back until the next piece settles it. Once a stop
    string appears, the text before it is the last thing returned, `stopped` is
    set and `found` is that string (the first to appear): the request is then
    aborted and finishes with "stop".
    """

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.held = ""
        self.stopped = False
        self.found: str | None = None

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        self.held += text
        found = [(i, s) for s in self.stops if (i := self.held.find(s)) >= 0]
        if found:
            at, self.found = min(found)
            self.stopped = True
            ready, self.held = self.held[:at], ""
            return ready
        keep = self.longest_partial_stop()
        ready = self.held[: len(self.held) - keep]
        self.held = self.held[len(self.held) - keep :]
        return ready

    def flush(self) -> str:
        """The held-back tail, once no more text will come."""
        ready, self.held = self.held, ""
        return ready

    def longest_partial_stop(self) -> int:
        """Length of the longest end of `held` that begins some stop string."""
        for length in range(
            min(len(self.held), max(map(len, self.stops), default=0)), 0, -1
        ):
            tail = self.held[-length:]
            if any(stop.startswith(tail) for stop in self.stops):
                return length
        return 0
