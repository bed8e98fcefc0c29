"""The target model's text as the scheduler handles it: chat rendering and token counts.

The scheduler renders every chat prompt into the exact text the model continues and
sends that text to the instance, so the tokens it counts against the context (and the
KV memory each row will hold) are the tokens the engine runs: the two agree by
construction, and there is one renderer. It reads the tokenizer with the `tokenizers`
library alone and renders the chat template with a sandboxed Jinja environment the
way Hugging Face tokenizers do: importing `transformers` would pull torch into a
process that has no use for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from specbatch.serving.chat import ChatFormat
from specbatch.serving.params import PromptError


class TargetText:
    """The target's tokenizer, context length and chat template."""

    def __init__(self, tokenizer: Tokenizer, max_context: int, template: Any = None) -> None:
        self.max_context = max_context
        self._tokenizer = tokenizer
        self._template = template

    @classmethod
    def load(cls, model_dir: str) -> TargetText:
        """From a local model directory, or the tokenizer files of a hub id."""
        root = Path(model_dir)
        if not root.is_dir():
            from huggingface_hub import snapshot_download

            root = Path(snapshot_download(model_dir, allow_patterns=["*.json", "*.jinja"]))
        config = json.loads((root / "config.json").read_text())
        return cls(
            Tokenizer.from_file(str(root / "tokenizer.json")),
            int(config["max_position_embeddings"]),
            _chat_template(root),
        )

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def model_text(self, content: str, chat: ChatFormat | None) -> str:
        """The text the model continues: ``content`` as it came, or with ``chat`` the
        conversation ending in this user turn, then the assistant's turn opened."""
        if chat is None:
            return content
        if self._template is None:
            raise PromptError("this model's tokenizer has no chat template; send the prompt without chat")
        messages = [{"role": role, "content": text} for role, text in chat.history]
        messages.append({"role": "user", "content": content})
        rendered = self._template.render(
            messages=messages, add_generation_prompt=True, enable_thinking=chat.enable_thinking
        )
        return rendered + chat.assistant_prefix


def _chat_template(root: Path) -> Any:
    source = None
    if (root / "chat_template.jinja").exists():
        source = (root / "chat_template.jinja").read_text()
    elif (root / "tokenizer_config.json").exists():
        source = json.loads((root / "tokenizer_config.json").read_text()).get("chat_template")
    if not source:
        return None
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    environment.filters["tojson"] = lambda value, **kw: json.dumps(value, ensure_ascii=False, **kw)
    environment.globals["raise_exception"] = _raise
    return environment.from_string(source)


def _raise(message: str) -> None:
    raise PromptError(f"chat template: {message}")
