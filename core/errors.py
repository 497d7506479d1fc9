"""The base class of every mistake a user can fix: a missing or corrupt file, a bad value, a directory of the wrong
kind. The ``bertzoo`` command prints such an error as one line (exit code 1) instead of a traceback; each part of
bertzoo raises its own subclass, whose message names the path or field and what to do."""


class UserError(Exception):
    """A problem with the user's input, not a bug: its message is all the user needs to see."""
