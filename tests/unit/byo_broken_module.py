"""A user module whose import fails (for the error-message test)."""

raise RuntimeError("this module is broken on purpose")
