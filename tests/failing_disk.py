"""A disk that fails on cue, for the tests of everything that writes through shared.files: the
os module as shared.files sees it, whose disk operations fail from a chosen one on."""

import errno
import os


class FailingOs:
    """The os module, as shared.files sees it (monkeypatch shared.files.os with it), whose disk
    operations (a write through fdopen, fsync, replace) fail from the `fail_at`-th one on, counted
    from 0, with `error` (default: ENOSPC, a full disk). A failing write first writes half of its
    data, as a disk that fills up midway does. `calls` lists the operations tried, in order."""

    def __init__(self, fail_at: int, error: BaseException | None = None) -> None:
        self.fail_at, self.error, self.calls = fail_at, error, []

    def failing(self) -> bool:
        return len(self.calls) > self.fail_at

    def raise_error(self):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) if self.error is None else self.error

    def disk(self, name: str, operation):
        def counted(*args):
            self.calls.append(name)
            if self.failing():
                self.raise_error()
            return operation(*args)

        return counted

    def write(self, file, data):
        self.calls.append("write")
        if self.failing():
            file.write(data[: len(data) // 2])
            file.flush()
            self.raise_error()
        return file.write(data)

    def __getattr__(self, name):
        if name in ("fsync", "replace"):
            return self.disk(name, getattr(os, name))
        if name == "fdopen":
            return lambda fd, mode: FailingFile(os.fdopen(fd, mode), self.write)
        return getattr(os, name)


class FailingFile:
    """A file whose writes go through FailingOs.write."""

    def __init__(self, file, write) -> None:
        self.file, self.counted_write = file, write

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def write(self, data):
        return self.counted_write(self.file, data)

    def __getattr__(self, name):
        return getattr(self.file, name)
