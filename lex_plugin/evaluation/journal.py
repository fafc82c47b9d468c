"""A probe's finished cells on disk, so that a killed probe resumes at its first unfinished cell.

``lex ruler`` and ``lex babilong`` with ``--json OUT`` keep ``OUT.cells.jsonl`` while they run: its first line is
the probe's signature (the checkpoint file's size and modification time, every option of the command, and a digest
of lex_plugin's source, so that a probe resumed after a code change starts afresh instead of mixing versions), then
one line per finished cell (a key, and the cell's results under every window). Run again with the same signature,
the probe reads the cells back instead of computing them; with another signature the file is started afresh. The
journal is removed once the JSON is written. A cell's prompts are seeded by the cell alone (task, length, depth,
trial), so a resumed probe's results equal an uninterrupted one's.
"""

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

__all__ = ["CellJournal", "JOURNAL_SUFFIX", "checkpoint_identity", "code_identity"]

logger = logging.getLogger(__name__)

JOURNAL_SUFFIX = ".cells.jsonl"


def checkpoint_identity(path) -> Dict[str, Any]:
    """What tells one checkpoint file from another at the same path: its resolved path, size in bytes and
    modification time in ns (a fine-tuning written again over it changes the last two)."""
    stat = Path(path).stat()
    return {"path": str(Path(path).resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def code_identity(root=None) -> str:
    """A digest of the code that computes a probe's cells: SHA-256 (hex, first 16 digits) over the relative path and
    bytes of every ``*.py`` file under ``root`` (default: the installed lex_plugin package), in sorted order. Any
    edit, a docstring's included, changes it: a resumed probe then recomputes rather than risk mixing versions."""
    root = Path(root) if root is not None else Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


class CellJournal:
    """The finished cells of one probe (``get`` / ``put``), appended to ``path`` as JSON lines.

    Args:
        path: the journal file (``OUT.cells.jsonl`` beside the probe's JSON).
        signature: a JSON-serialisable dict of everything the cells depend on; a journal on disk with another
            signature, or one that cannot be read, is replaced.

    Keys are JSON-serialisable values (a cell's (task, length, depth) as a list); values are lists of dicts (a
    cell's results, one per window). A line cut short by a kill is ignored, as are the lines after it.
    """

    def __init__(self, path, signature: Dict[str, Any]):
        self.path = Path(path)
        self.signature = json.loads(json.dumps(signature))  # as it reads back (tuples become lists)
        self._cells: Dict[str, List[dict]] = {}
        if self.path.is_file():
            self._read()
        if not self._cells:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({"signature": self.signature}) + "\n")
        else:
            logger.info("%s: resuming after %d finished cells", self.path, len(self._cells))

    def _read(self) -> None:
        lines = self.path.read_text().splitlines()
        try:
            head = json.loads(lines[0]) if lines else None
        except json.JSONDecodeError:
            head = None
        if not head or head.get("signature") != self.signature:
            logger.warning("%s belongs to another probe (checkpoint or options differ): starting afresh", self.path)
            return
        good = 1
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # the line a kill cut short: drop it and what follows
                break
            self._cells[self._key(entry["key"])] = entry["results"]
            good += 1
        if good < len(lines):
            self.path.write_text("".join(line + "\n" for line in lines[:good]))

    @staticmethod
    def _key(key) -> str:
        return json.dumps(key)

    def __len__(self) -> int:
        return len(self._cells)

    def get(self, key) -> Optional[List[dict]]:
        """The results recorded for ``key``, or None when that cell has not finished."""
        return self._cells.get(self._key(key))

    def put(self, key, results: List[dict]) -> None:
        """Record a finished cell: one line, flushed and synced before returning."""
        self._cells[self._key(key)] = results
        with self.path.open("a") as f:
            f.write(json.dumps({"key": json.loads(json.dumps(key)), "results": results}) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def remove(self) -> None:
        """Delete the journal (the probe's JSON is written)."""
        self.path.unlink(missing_ok=True)
