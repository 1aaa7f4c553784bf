"""Chat models in the agent loop: tool-call formats and the incremental token protocol.

Pure Python (no torch, no transformers import): the tokenizer is passed in.
See docs/chat-protocol.md.
"""

from libra.chat.protocol import TOOL_TEMPLATES, ChatFormat, hermes_template
from libra.chat.toolcalls import (
    PARSERS,
    ArithParser,
    HermesParser,
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    get_parser,
)

__all__ = [
    "PARSERS",
    "TOOL_TEMPLATES",
    "ArithParser",
    "ChatFormat",
    "HermesParser",
    "ParsedTurn",
    "ToolCall",
    "ToolCallParser",
    "get_parser",
    "hermes_template",
]
