"""A size-rotated log of raw bytes: `<path>`, then `<path>.1` … `<path>.<backups>` (oldest last).

An engine's output went to one file for the engine's whole life, and an engine that logs every
request filled the disk under the data dir. `logging.handlers.RotatingFileHandler` takes text
records and opens files with the umask and through symlinks; engine output is bytes from a pipe,
and each file here is opened 0600 without following a symlink (engine_process.open_engine_log).
"""

from __future__ import annotations

import os
import threading
from typing import Callable

# 64 MiB × (1 + 3): a day of an engine's request log at a few requests a second, and a bound of
# 256 MiB per engine on a data dir that also holds checkpoints as large as the model.
MAX_BYTES = 64 << 20
BACKUPS = 3


class RotatingLog:
    """Appends bytes to `path`, moving it to `path.1` (and so on) once it would pass `max_bytes`."""

    def __init__(self, path: str, opener: Callable[[str], int], max_bytes: int = MAX_BYTES, backups: int = BACKUPS) -> None:
        if max_bytes < 1 or backups < 0:
            raise ValueError(f"max_bytes must be positive and backups at least 0, got {max_bytes} and {backups}")
        self.path, self.opener, self.max_bytes, self.backups = path, opener, max_bytes, backups
        self._lock = threading.Lock()
        self._closed = False
        self._fd = opener(path)
        self._size = os.fstat(self._fd).st_size

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._closed:
                return
            if self._fd < 0:
                # A rotation failed half-way (a full disk): start again with whatever is at `path`.
                self._fd = self.opener(self.path)
                self._size = os.fstat(self._fd).st_size
            # Split at the limit, so that no file passes it even for one large chunk; a line cut in
            # two continues at the top of the next file.
            while data:
                room = self.max_bytes - self._size
                if room <= 0:
                    self._rotate()
                    room = self.max_bytes
                part, data = data[:room], data[room:]
                os.write(self._fd, part)
                self._size += len(part)

    def _rotate(self) -> None:
        os.close(self._fd)
        # Never left naming a closed descriptor: the number may be reused by another file meanwhile.
        self._fd = -1
        if self.backups == 0:
            os.unlink(self.path)
        else:
            for n in range(self.backups - 1, 0, -1):
                if os.path.lexists(f"{self.path}.{n}"):
                    os.replace(f"{self.path}.{n}", f"{self.path}.{n + 1}")
            os.replace(self.path, f"{self.path}.1")
        self._fd = self.opener(self.path)
        self._size = 0

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def pump(fd: int, out: RotatingLog) -> threading.Thread:
    """A daemon thread copying `fd` (a pipe's read end, closed at EOF) into `out` until EOF."""
    def run() -> None:
        try:
            while chunk := os.read(fd, 1 << 16):
                try:
                    out.write(chunk)
                except OSError:
                    # A full disk loses this output; the pipe is still drained, or the engine would
                    # block writing to it and stop serving.
                    pass
        except OSError:
            pass
        finally:
            os.close(fd)
            out.close()

    t = threading.Thread(target=run, name=f"log-pump {os.path.basename(out.path)}", daemon=True)
    t.start()
    return t


def tail(path: str, backups: int, max_chars: int) -> str:
    """The last `max_chars` bytes of the log, reaching into the rotated files when the current one is short."""
    parts: list[bytes] = []
    need = max_chars
    for name in [path, *(f"{path}.{n}" for n in range(1, backups + 1))]:
        try:
            with open(name, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - need))
                data = f.read()
        except OSError:
            break
        parts.insert(0, data)
        need -= len(data)
        if need <= 0:
            break
    return b"".join(parts).decode("utf-8", errors="replace").strip()
