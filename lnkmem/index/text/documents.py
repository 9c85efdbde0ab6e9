"""Documents (§3.3): PDF, DOCX, ODT, PPTX, EPUB and HTML to text through
``lnk-documents text <file>`` when that program is on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Optional

SUFFIXES = (".pdf", ".docx", ".odt", ".pptx", ".epub", ".html", ".htm")
TIMEOUT_S = 30


def is_document(path: str) -> bool:
    return path.lower().endswith(SUFFIXES)


def converter() -> Optional[str]:
    return shutil.which("lnk-documents")


def convert(data: bytes, name: str, tmpdir: str, local_path: Optional[str] = None) -> Optional[str]:
    """The document's text, or None when it cannot be converted.

    A local file is handed over by path; bytes from elsewhere are written to a
    temporary file in ``tmpdir`` (the engine's state) first.
    """
    program = converter()
    if program is None:
        return None
    tmp = None
    try:
        if local_path is None:
            os.makedirs(tmpdir, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix="doc-", suffix=os.path.splitext(name)[1], dir=tmpdir)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            local_path = tmp
        out = subprocess.run(
            [program, "text", local_path], capture_output=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
        )
        if out.returncode != 0:
            return None
        return out.stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass
