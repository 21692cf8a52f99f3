"""Read a YAML (.yaml, .yml) or JSON file of settings: `--config FILE` and `asyncrl-sweep FILE`."""

from __future__ import annotations

import json
import os
from typing import Any


class SettingsFileError(ValueError):
    """The file cannot be read or parsed; the message says what is wrong and names the file."""


def load_settings_file(path: str) -> Any:
    """The parsed contents (None for an empty YAML file); SettingsFileError with one line otherwise."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise SettingsFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if path.endswith((".yaml", ".yml")):
        import yaml  # a declared dependency (install_requires)

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SettingsFileError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if not path.endswith(".json"):  # run.toml, run.ini: not a format read here, whatever its contents
            suffix = os.path.splitext(path)[1] or "a file without a suffix"
            raise SettingsFileError(f"{path}: settings files are YAML (.yaml, .yml) or JSON (.json), not "
                                    f"{suffix}") from None
        raise SettingsFileError(f"{path} is not valid JSON: {exc}") from None
