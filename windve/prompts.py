"""The prompt put in front of inputs: sentence-transformers' prompts, as the settings choose them.

Apart from the request pipeline so that `windve serve` can check the setting before the engines
load (service.check_plan) without importing the front end's metrics into the dispatcher's
process: there, a metric family the dispatcher reports hides the front ends' (frontend/exposition.py).
"""

from __future__ import annotations

from windve.model import ModelSpec
from windve.settings import Settings


def default_prompt(spec: ModelSpec, settings: Settings) -> str:
    """The prompt for requests that name none: the setting's text or name, else the model's default.
    ValueError (the service does not start) where `prompt_text` refuses it."""
    if settings.default_prompt is not None:
        return poolable(spec, settings.default_prompt)
    name = settings.default_prompt_name or spec.default_prompt_name
    return "" if name is None else prompt_text(spec, name)


def prompt_text(spec: ModelSpec, name: str) -> str:
    """The model's prompt `name`; ValueError for a name it does not have."""
    try:
        return poolable(spec, spec.prompt(name))
    except KeyError:
        names = ", ".join(known for known, _ in spec.prompts) or "none"
        raise ValueError(f"prompt_name {name!r} is not one of model {spec.name}'s prompts ({names})") from None


def poolable(spec: ModelSpec, prompt: str) -> str:
    """`prompt`, unless the model pools without its prompt's tokens (include_prompt: false), which
    the engines do not do: then ValueError rather than vectors unlike sentence-transformers'."""
    if prompt and not spec.include_prompt:
        raise ValueError(f"model {spec.name} pools without its prompt (include_prompt: false), which this service "
                         "does not do")
    return prompt
