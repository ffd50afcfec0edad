"""Secrets kept out of summaries, which are world-readable files shared across a team.

A value is redacted when its key looks like a key, token, password or secret (``wandb_api_key``,
``HF_TOKEN``, ``--password``, ``apiKey``), in Hydra overrides (``+exp_manager.wandb_api_key=...``,
``{api_key:...}`` inside a dict value), ``--key=value`` and ``--key value`` options, environment
variables, and the credentials of URLs (``https://user:pass@host``), with or without a scheme
(``user:pass@registry/image:tag``, an image reference written with its login). Redacting a harmless value
(a ``sort_key``) is the price of never leaking a real one. Torch-free: importers use it too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

REDACTED = "<redacted>"

# Words of a key name (split at . _ - / and camelCase) that mark its value secret.
_SECRET_WORDS = frozenset({"key", "apikey", "accesskey", "secretkey", "token", "secret", "password", "passwd",
                           "pwd", "passphrase", "credential", "credentials", "auth", "authorization", "cookie"})
_WORD_SPLIT = re.compile(r"[^a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/@\s]+)@")
# user:password@host with no scheme, at a word's start or after = , or whitespace (no / before the @);
# not an image's name:tag@sha256:... digest
_BARE_CREDENTIALS = re.compile(r"(?P<head>^|[=,\s])(?P<userinfo>[^/@\s:=,]+:[^/@\s]+)@(?=[^/@\s])(?!sha(256|384|512):)")
_ASSIGNMENT = re.compile(r"^(?P<key>[+~]*-{0,2}[\w.\-/]+)=(?P<value>.*)$", re.DOTALL)
# key: value pairs inside a Hydra dict value, {api_key: abc, project: p}
_DICT_ENTRY = re.compile(r"(?P<head>[{,]\s*)(?P<key>[\w.\-]+)(?P<sep>\s*:\s*)(?P<value>'[^']*'|\"[^\"]*\"|[^,{}]*)")


def looks_secret(key: str) -> bool:
    """``wandb_api_key``, ``HF_TOKEN``, ``--db-password``, ``apiKey``: yes; ``tokenizer``, ``num_tokens``: no."""
    words = _WORD_SPLIT.split(_CAMEL.sub("_", key).lower())
    return any(word in _SECRET_WORDS for word in words)


def redact_url_credentials(text: str) -> str:
    """``https://user:pass@host/x`` -> ``https://<redacted>@host/x`` (a user name alone may be a token);
    ``user:pass@host/x`` -> ``<redacted>@host/x`` (without a scheme, only a user with a password: a
    bare ``name@host`` is an address, or enroot's user before a registry)."""
    text = _URL_CREDENTIALS.sub(lambda match: f"{match['scheme']}{REDACTED}@", text)
    return _BARE_CREDENTIALS.sub(lambda match: f"{match['head']}{REDACTED}@", text)


def redact_argument(argument: str) -> str:
    """One command-line word: ``key=value`` / ``--key=value`` with a secret key, and URL credentials."""
    argument = redact_url_credentials(argument)
    assignment = _ASSIGNMENT.match(argument)
    if assignment is None:
        return argument
    key, value = assignment["key"], assignment["value"]
    if looks_secret(key):
        return f"{key}={REDACTED}"
    return f"{key}={_DICT_ENTRY.sub(_redact_dict_entry, value)}"


def _redact_dict_entry(match: re.Match[str]) -> str:
    if not looks_secret(match["key"]) or not match["value"]:  # no value: a nested dict, redacted entry by entry
        return match[0]
    return f"{match['head']}{match['key']}{match['sep']}{REDACTED}"


def redact_command(argv: Sequence[str]) -> str:
    """The command line as one string, secrets redacted; ``--api-key VALUE`` redacts the next word."""
    words, secret_follows = [], False
    for argument in argv:
        if secret_follows and not argument.startswith("-"):
            words.append(REDACTED)
        else:
            words.append(redact_argument(argument))
        secret_follows = argument.startswith("-") and "=" not in argument and looks_secret(argument)
    return " ".join(words)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment variables as recorded: values of secret-looking names redacted, URL credentials removed."""
    return {name: REDACTED if looks_secret(name) else redact_url_credentials(value) for name, value in env.items()}
