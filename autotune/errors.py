"""Errors that reach the user as one line, no traceback, each with its exit status: bad input (UserError and its
kinds) 2; a search that cannot go on, or a file that cannot be written, 1; nothing satisfies the constraints 3; the
storage out past its patience 75."""


class UserError(Exception):
    """Bad input: the message says what is wrong and how to fix it."""


class SpaceError(UserError):
    """A search-space file that cannot be used."""


class StudyMismatchError(UserError):
    """An existing study was created with other settings."""


class NothingSatisfiesError(Exception):
    """`autotune best` found no configuration that satisfies the constraints: exit status 3."""

    EXIT_STATUS = 3


class SearchError(Exception):
    """The search cannot go on (e.g. the reference configuration fails); exit status 1."""


class StorageUnavailableError(Exception):
    """The study's storage stayed unreachable, locked or full past --storage-patience: exit status 75
    (EX_TEMPFAIL: run the same command again once the storage is back)."""

    EXIT_STATUS = 75


class OutputError(Exception):
    """A file autotune writes (a report) could not be written: a full disk, a folder it may not write. Exit
    status 1; what the study stores is untouched."""
