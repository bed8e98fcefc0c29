"""The target's token count and chat rendering, without torch.

The scheduler counts every prompt's tokens (the context check, and the KV memory each
row will hold) but never runs a model, so it reads the tokenizer with the `tokenizers`
library alone and renders the chat template with a sandboxed Jinja environment the way
Hugging Face tokenizers do. Importing `transformers` would pull torch into a process
that has no use for it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from specbatch.serving.chat import ChatFormat
from specbatch.serving.params import PromptError

ChatRenderer = Callable[[str, ChatFormat], str]


def load_token_counter(model_dir: str) -> tuple[Callable[[str], int], int, ChatRenderer]:
    """The token count, the model's context length, and its chat rendering."""
    root = Path(model_dir)
    if not root.is_dir():
        from huggingface_hub import snapshot_download

        root = Path(snapshot_download(model_dir, allow_patterns=["*.json", "*.jinja"]))
    tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    config = json.loads((root / "config.json").read_text())
    template = _chat_template(root)

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    def render(content: str, chat: ChatFormat) -> str:
        if template is None:
            raise PromptError("this model's tokenizer has no chat template; send the prompt without chat")
        messages = [{"role": role, "content": text} for role, text in chat.history]
        messages.append({"role": "user", "content": content})
        rendered = template.render(
            messages=messages, add_generation_prompt=True, enable_thinking=chat.enable_thinking
        )
        return rendered + chat.assistant_prefix

    return count_tokens, int(config["max_position_embeddings"]), render


def _chat_template(root: Path) -> Any:
    source = None
    if (root / "chat_template.jinja").exists():
        source = (root / "chat_template.jinja").read_text()
    elif (root / "tokenizer_config.json").exists():
        source = json.loads((root / "tokenizer_config.json").read_text()).get("chat_template")
    if not source:
        return None
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["tojson"] = lambda value, **kw: json.dumps(value, ensure_ascii=False, **kw)
    environment.globals["raise_exception"] = _raise
    return environment.from_string(source)


def _raise(message: str) -> None:
    raise PromptError(f"chat template: {message}")
