"""Errors a user should see: each names the site and the file at fault."""


class DataError(ValueError):
    """Bad input data: a missing datalist or file, a shape mismatch, a label out of range, an empty split."""

    def __init__(self, site: str, path: str, problem: str):
        self.site, self.path, self.problem = site, str(path), problem
        super().__init__(f"[{site}] {path}: {problem}")
