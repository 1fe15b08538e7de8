"""Files dropped into the prompt: read as text, or refused with one clear message naming the file.

Plain text and code as they are; .pdf through pypdf; .docx through python-docx. Binary, empty,
encrypted, malformed or oversized files are refused, never a crash. Parsing is run off the GUI
thread with a time limit by the caller (see `app.main_window.MainWindow.attach`).
"""
from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from pathlib import Path

MAX_BYTES = 20 * 1024 * 1024
TIME_LIMIT_S = 20.0
TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".rst", ".csv", ".tsv", ".json", ".jsonl", ".html", ".htm", ".xml",
                 ".yaml", ".yml", ".toml", ".ini", ".cfg", ".log", ".py", ".js", ".ts", ".tsx", ".jsx", ".java",
                 ".c", ".h", ".cpp", ".hpp", ".cc", ".cs", ".go", ".rs", ".rb", ".php", ".sh", ".bash", ".sql",
                 ".kt", ".swift", ".scala", ".r", ".m", ".lua", ".pl", ".tex", ".css", ".scss", ".vue", ".ipynb"}


class DocumentError(Exception):
    def __init__(self, path: Path, problem: str):
        self.path, self.problem = Path(path), problem
        super().__init__(f"{Path(path).name}: {problem}")


@dataclass(frozen=True)
class Document:
    path: Path
    text: str
    size: int
    pages: int | None = None

    @property
    def name(self) -> str:
        return self.path.name


def _looks_binary(data: bytes) -> bool:
    if b"\x00" in data[:8192]:
        return True
    try:
        data[:65536].decode("utf-8")
        return False
    except UnicodeDecodeError as e:
        return e.start < len(data[:65536]) - 4  # a character cut at the sample's end is fine


def parse(path: str | Path) -> Document:
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise DocumentError(path, f"cannot be read ({e.strerror or e})") from None
    if not path.is_file():
        raise DocumentError(path, "is not a file")
    if size > MAX_BYTES:
        raise DocumentError(path, f"is {size / 2**20:.1f} MB; the limit is {MAX_BYTES // 2**20} MB")
    if size == 0:
        raise DocumentError(path, "is empty")
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        return _pdf(path, size)
    if suffix == ".docx":
        return _docx(path, size)
    data = path.read_bytes()
    if suffix not in TEXT_SUFFIXES and _looks_binary(data):
        raise DocumentError(path, "is a binary file; attach text, code, PDF or DOCX files")
    if _looks_binary(data):
        raise DocumentError(path, "is not valid text (binary content)")
    text = data.decode("utf-8", errors="replace")
    if suffix in (".html", ".htm"):
        text = _html_text(text)
    return Document(path, text, size)


def _html_text(html: str) -> str:
    from html.parser import HTMLParser

    class P(HTMLParser):
        def __init__(self):
            super().__init__()
            self.out, self.skip = [], 0

        def handle_starttag(self, tag, attrs):
            self.skip += tag in ("script", "style")

        def handle_endtag(self, tag):
            self.skip -= tag in ("script", "style") and self.skip > 0

        def handle_data(self, d):
            if not self.skip:
                self.out.append(d)

    p = P()
    p.feed(html)
    return " ".join(" ".join(p.out).split())


def _pdf(path: Path, size: int) -> Document:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(str(path))
        if reader.is_encrypted:
            raise DocumentError(path, "is an encrypted PDF; remove its password first")
        pages = [p.extract_text() or "" for p in reader.pages]
    except DocumentError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as e:
        raise DocumentError(path, f"is not a readable PDF ({e})") from None
    except Exception as e:  # pypdf raises a wide range on malformed files
        raise DocumentError(path, f"is not a readable PDF ({type(e).__name__})") from None
    text = "\n\n".join(f"[page {i + 1}]\n{t}" for i, t in enumerate(pages))
    if not "".join(pages).strip():
        raise DocumentError(path, "has no extractable text (a scanned PDF needs OCR first)")
    return Document(path, text, size, pages=len(pages))


def _docx(path: Path, size: int) -> Document:
    import zipfile

    try:
        import docx

        d = docx.Document(str(path))
    except (zipfile.BadZipFile, KeyError, ValueError) as e:
        raise DocumentError(path, f"is not a readable DOCX ({e})") from None
    except Exception as e:
        raise DocumentError(path, f"is not a readable DOCX ({type(e).__name__})") from None
    parts = [p.text for p in d.paragraphs]
    for table in d.tables:
        for row in table.rows:
            parts.append(" | ".join(c.text for c in row.cells))
    text = "\n".join(parts)
    if not text.strip():
        raise DocumentError(path, "has no text")
    return Document(path, text, size)


# Workers for parsing off the GUI thread; the window applies TIME_LIMIT_S (MainWindow.attach).
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="doc-parse")


def parse_later(path) -> concurrent.futures.Future:
    """parse(path) on the parsing threads; a Future of the Document."""
    return _pool.submit(parse, path)


def prompt_with_documents(text: str, docs: list[Document]) -> str:
    """The user's message with the attached documents' text before it."""
    parts = [f"<document name=\"{d.name}\">\n{d.text}\n</document>" for d in docs]
    return "\n\n".join(parts + [text]) if parts else text


def first_part(doc: Document, tokens_allowed: int, count_tokens) -> Document:
    """The largest leading part of `doc` that fits `tokens_allowed` tokens (binary search on chars)."""
    lo, hi = 0, len(doc.text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(doc.text[:mid]) <= tokens_allowed:
            lo = mid
        else:
            hi = mid - 1
    return Document(doc.path, doc.text[:lo], doc.size, doc.pages)
