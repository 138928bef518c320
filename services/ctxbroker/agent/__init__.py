"""The context agent that runs on every node (``epu ctx agent``)."""
