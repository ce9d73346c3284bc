"""Reference applications built on gguflm's public API (``chat_gui``: ``gguflm chat --gui``)."""
