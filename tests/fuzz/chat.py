"""Chat templates embedded in models (untrusted Jinja; llama-cpp-python's CVE-2024-34359 came from
rendering one outside a sandbox), rendered in gguflm's sandbox with random messages.

Must hold: ChatTemplateError (a :class:`gguflm.Error`) or a rendered str, within the time cap.
"""

from __future__ import annotations

from gguflm.chat import ChatTemplate
from gguflm.errors import Error

from . import Check
from .grammars import text_of

ROLES = ("system", "user", "assistant", "tool")


def chat_template() -> Check:
    """Input: the template, then NUL-separated message contents (roles cycle through ROLES; an
    empty first content leaves out the generation prompt)."""

    def check(data: bytes) -> None:
        source, *contents = text_of(data).split("\0")
        messages = [{"role": ROLES[i % len(ROLES)], "content": content}
                    for i, content in enumerate(contents[:8])]
        try:
            template = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
            out = template.render(messages, add_generation_prompt=bool(contents and contents[0]))
        except Error:
            return
        assert isinstance(out, str)

    return check
