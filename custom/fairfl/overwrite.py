"""Whether a command may write into a folder it is given: the one check every fairfl command that writes output
makes first (no imports of the package: the CLI, the report, the recipe and deploy all use it)."""

from __future__ import annotations

from pathlib import Path


def refuse_to_overwrite(path: str, force: bool, what: str, replaceable=lambda folder: True) -> str | None:
    """Why `path` must not be written (it exists and is not an empty folder, and `force` is not given or the
    folder is not `replaceable`, i.e. not output of this kind), or None."""
    folder = Path(path)
    if not folder.exists() or (folder.is_dir() and not any(folder.iterdir())):
        return None
    if not folder.is_dir():
        return f"{path} exists and is not a folder"
    if not force:
        return f"{path} is not empty: choose another {what} or give --force to replace it"
    if not replaceable(folder):
        return f"{path} does not look like a {what} (refusing to replace it even with --force)"
    return None
