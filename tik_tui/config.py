"""UI settings: `$XDG_CONFIG_HOME/tik/config.toml` (default `~/.config/tik/config.toml`).

```toml
theme = "textual-light"      # any Textual theme name; ctrl+t toggles light/dark
poll_interval = 1.0          # seconds between store polls
[keymap]                     # binding id -> keys (comma-separated), overrides the defaults
approve = "a,y"
reject = "r"
```

`$TIK_CONFIG` names another file. A missing file means defaults; a malformed one is a user
error reported before the application starts.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_THEME = "textual-dark"


class ConfigError(Exception):
    """The config file exists but cannot be used; the message names the file and the cause."""


@dataclass(frozen=True)
class UiConfig:
    theme: str = DEFAULT_THEME
    poll_interval: float = 1.0
    keymap: dict[str, str] = field(default_factory=dict)


def config_path() -> Path:
    if os.environ.get("TIK_CONFIG"):
        return Path(os.environ["TIK_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tik" / "config.toml"


def load_config(path: Path | None = None) -> UiConfig:
    path = path or config_path()
    if not path.is_file():
        return UiConfig()
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from e
    theme = doc.get("theme", DEFAULT_THEME)
    interval = doc.get("poll_interval", 1.0)
    keymap = doc.get("keymap", {})
    if not isinstance(theme, str):
        raise ConfigError(f"{path}: theme must be a string")
    if not isinstance(interval, int | float) or not 0.05 <= interval <= 60:
        raise ConfigError(f"{path}: poll_interval must be a number of seconds in [0.05, 60]")
    if not isinstance(keymap, dict) or not all(isinstance(v, str) for v in keymap.values()):
        raise ConfigError(f"{path}: [keymap] maps binding ids to key strings")
    return UiConfig(theme=theme, poll_interval=float(interval), keymap=dict(keymap))
