"""The project's own tools: the install hook and the chat page check."""
