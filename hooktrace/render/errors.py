"""The one error renderers raise (its own file, so each renderer imports it without the package)."""


class RenderError(Exception):
    """A problem the user can fix (unknown format, missing Graphviz, bad option): shown as one line."""
