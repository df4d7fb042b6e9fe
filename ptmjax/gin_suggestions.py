"""'Did you mean' hints for gin: misspelt gin files, configurables and parameters, and model-size aliases.

Aliases (`models/t5_1_1_xl.gin`, `t5-small`) fail with a hint naming the real
file rather than resolving quietly: gin's own `include` lines cannot go
through an alias, so accepting one on the command line would teach a name
that breaks inside gin files, and the file named in a command stays the file
saved runs and config.gin refer to.
"""

from __future__ import annotations

import difflib
import inspect
import re
import tokenize
from collections.abc import Iterable
from pathlib import PurePosixPath

import gin

SIZE_ALIASES = {"xl": "3B", "xxl": "11B", "3b": "3B", "11b": "11B"}  # Hugging Face / T5X names of T5 sizes
_UNKNOWN_PARAMETER = re.compile(r"Configurable '([\w.]+)' doesn't have a parameter named '(\w+)'")
_UNKNOWN_CONFIGURABLE = re.compile(r"No configurable matching (?:reference '@)?'?([\w.]+)")


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """'; did you mean 'x'?' for the (at most 3) choices closest to `word`, each after `prefix`; or ''."""
    matches = difflib.get_close_matches(word, sorted(set(choices)), n=3, cutoff=0.75)
    return f"; did you mean {' or '.join(repr(prefix + m) for m in matches)}?" if matches else ""


def model_alias(name: str, known: Iterable[str]) -> str | None:
    """The known gin file a T5 alias means: 't5_1_1_xl' -> 'models/t5_1_1_3B.gin', 't5-small' ->
    'models/t5_1_0_small.gin' (Hugging Face's t5-* are T5 1.0); None when `name` is not such an alias."""
    path = PurePosixPath(name)
    if str(path.parent) not in (".", "models"):
        return None
    stem = path.name.removesuffix(".gin").lower().replace("-", "_").replace("t5_v1_", "t5_1_")
    match = re.fullmatch(r"t5_(?:(1_[01])_)?(\w+)", stem)
    if not match:
        return None
    version, size = match.group(1) or "1_0", match.group(2)
    candidate = f"models/t5_{version}_{SIZE_ALIASES.get(size, size)}.gin"
    return candidate if candidate in set(known) else None


def explain_gin_error(error: Exception) -> str:
    """Gin's parse error as one line, with a 'did you mean' for an unknown configurable or parameter."""
    if isinstance(error, tokenize.TokenError):  # str() of it is a tuple
        return f"cannot parse the gin files or bindings: {error.args[0]} (an unclosed bracket or quote?)"
    lines = [line.strip() for line in str(error).splitlines()]
    where = [line for line in lines[1:] if line and set(line) != {"^"}]
    if isinstance(error, SyntaxError) and error.text:
        where.append(error.text.strip())
    message = lines[0].rstrip(".") + (f" ({': '.join(where)})" if where else "")
    match = _UNKNOWN_PARAMETER.search(lines[0])
    if match and (configurable := gin.config._REGISTRY.get_match(match.group(1))):  # noqa: SLF001
        parameters = inspect.signature(configurable.wrapped).parameters
        return message + did_you_mean(match.group(2), parameters, prefix=f"{match.group(1)}.")
    if match := _UNKNOWN_CONFIGURABLE.search(lines[0]):
        return message + did_you_mean(match.group(1), _configurable_names())
    return message


def _configurable_names() -> set[str]:
    """Every registered configurable, by its short name and by its full selector."""
    selectors = list(gin.config._REGISTRY._selector_map)  # noqa: SLF001 - gin has no public listing
    return set(selectors) | {selector.rsplit(".", 1)[-1] for selector in selectors}
