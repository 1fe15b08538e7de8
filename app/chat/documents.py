"""Files dropped into the prompt: read as text, or refused with one clear message naming the file.

Plain text and code as they are (UTF-8, or the encoding charset-normalizer detects: UTF-16,
Latin-1, ...); .pdf through pypdf (also those with an empty user password); .docx through
python-docx. Binary, empty, encrypted, malformed or oversized files are refused, never a crash.

Documents never hurt the window (`parse_later`): PDF and DOCX are parsed in a child process that
is killed at the time limit and has a memory cap, so a hung or exploding parse never holds a worker;
a DOCX whose parts inflate past MAX_UNZIPPED is refused before it is parsed; extracted text is
capped; and the token count and the "first part" cut run on the worker thread, not the GUI's.
"""
from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from pathlib import Path

MAX_BYTES = 20 * 1024 * 1024
MAX_UNZIPPED = 100 * 1024 * 1024  # a DOCX's parts, inflated
MAX_TEXT_CHARS = 20_000_000  # extracted text
CHILD_MEMORY = 2 << 30  # address space of the parsing process (Linux)
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
    text = _decode(data)
    if text is None:
        if suffix not in TEXT_SUFFIXES:
            raise DocumentError(path, "is a binary file; attach text, code, PDF or DOCX files")
        raise DocumentError(path, "is not valid text (binary content)")
    if suffix in (".html", ".htm"):
        text = _html_text(text)
    return _capped(Document(path, text, size))


def _decode(data: bytes) -> str | None:
    """The text in data: UTF-8 (with or without a BOM), UTF-16/32 with a BOM, or the encoding
    charset-normalizer finds; None for binary content."""
    import codecs

    for bom, enc in ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
                     (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(bom):
            try:
                return data.decode(enc)
            except UnicodeDecodeError:
                return None
    if not _looks_binary(data):
        return data.decode("utf-8", errors="replace")
    from charset_normalizer import from_bytes

    matches = from_bytes(data[:1 << 20])  # detect on the first MB, decode all
    best = matches.best()
    if best is None or best.encoding is None:
        return None
    # single-byte Western text fits several code pages equally well; prefer the common one
    western = [m for m in matches if m.encoding in ("cp1252", "latin_1", "iso8859_15")
               and m.percent_chaos <= best.percent_chaos]
    best = western[0] if western else best
    try:
        text = data.decode(best.encoding)
    except (UnicodeDecodeError, LookupError):
        return None
    controls = sum(1 for ch in text[:65536] if ord(ch) < 32 and ch not in "\t\n\r\f")
    return None if controls > len(text[:65536]) // 100 else text


def _capped(doc: Document) -> Document:
    if len(doc.text) > MAX_TEXT_CHARS:
        raise DocumentError(doc.path, f"holds {len(doc.text) / 1e6:.0f} million characters of text; the limit is "
                            f"{MAX_TEXT_CHARS // 1_000_000} million")
    return doc


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
        if reader.is_encrypted and not reader.decrypt(""):  # an empty user password opens it in any reader
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
    return _capped(Document(path, text, size, pages=len(pages)))


def _docx(path: Path, size: int) -> Document:
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            inflated = sum(i.file_size for i in z.infolist())
    except (zipfile.BadZipFile, OSError) as e:
        raise DocumentError(path, f"is not a readable DOCX ({e})") from None
    if inflated > MAX_UNZIPPED:
        raise DocumentError(path, f"inflates to {inflated / 2**20:,.0f} MB when unpacked; the limit is "
                            f"{MAX_UNZIPPED // 2**20} MB")
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
    return _capped(Document(path, text, size))


# Threads that run a parse (text here, PDF and DOCX in a child process each) and fit the result
# to the context, off the GUI thread.
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="doc-parse")
CHILD_SUFFIXES = (".pdf", ".docx")


@dataclass(frozen=True)
class Fitted:
    """A parsed document and how it fits the context: tokens (a lower bound when not exact), and
    its first part that fits (None when the whole fits, or nobody asked)."""

    doc: Document
    tokens: int
    exact: bool
    part: Document | None = None


def parse_later(path, room: int = 0, count_tokens=None, longest: int = 0) -> concurrent.futures.Future:
    """parse(path) and fit it to `room` tokens, off the GUI thread; a Future of Fitted (see fit)."""
    return _pool.submit(_parse_and_fit, path, room, count_tokens, longest)


def _parse_and_fit(path, room: int, count_tokens, longest: int = 0) -> Fitted:
    path = Path(path)
    doc = parse_in_child(path) if path.suffix.lower() in CHILD_SUFFIXES else parse(path)
    if count_tokens is None or room <= 0:
        return Fitted(doc, 0, False)
    return fit(doc, room, count_tokens, longest)


def fit(doc: Document, room: int, count_tokens, longest: int = 0) -> Fitted:
    """Count doc's tokens against `room`. Only a prefix of 16 characters a token of room is read (no
    tokenizer averages more), so a 19 MB file costs what its first part costs. longest: the room of
    the longest context the model could open at (more than room): a document that would fit there is
    counted exactly (the window then offers that context)."""
    limit = 16 * max(room, longest)
    head = doc.text[:limit]
    n = count_tokens(head)
    if len(doc.text) <= limit:
        return Fitted(doc, n, True, first_part(doc, room, count_tokens) if n > room else None)
    if n <= max(room, longest):  # an unusual text (long runs of spaces): count it all
        n = count_tokens(doc.text)
        return Fitted(doc, n, True, first_part(doc, room, count_tokens) if n > room else None)
    return Fitted(doc, n, False, first_part(Document(doc.path, head, doc.size, doc.pages), room, count_tokens))


def parse_in_child(path: Path, time_limit_s: float | None = None) -> Document:
    """parse(path) in a child process, killed at the time limit; its memory capped."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # no fork of a process that runs Qt and torch threads
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(str(path), send), name="mixdesk-parse", daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(TIME_LIMIT_S if time_limit_s is None else time_limit_s):
            raise DocumentError(path, f"took longer than {TIME_LIMIT_S:.0f} s to read; the reader was stopped")
        try:
            kind, payload = receive.recv()
        except (EOFError, OSError):
            raise DocumentError(path, "could not be read: the reader stopped (out of memory?)") from None
    finally:
        receive.close()
        if child.is_alive():
            child.kill()
        child.join(5)
    if kind == "error":
        raise DocumentError(path, payload)
    return payload


def _child(path: str, send) -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))
    except (ImportError, ValueError, OSError):
        pass  # not on this platform: the time limit still holds
    try:
        send.send(("ok", parse(path)))
    except DocumentError as e:
        send.send(("error", e.problem))
    except MemoryError:
        send.send(("error", f"needs more than {CHILD_MEMORY >> 30} GB of memory to read"))
    except Exception as e:  # noqa: BLE001 - a parser's failure is the file's problem, named
        send.send(("error", f"could not be read ({type(e).__name__})"))
    finally:
        send.close()


def prompt_with_documents(text: str, docs: list[Document]) -> str:
    """What the model reads of a message with attached documents: each document with clear
    boundaries (its number and name, its text, an end marker naming it again), then what the user
    typed. The one place this is formatted; the store keeps it as the message's content (later turns
    send it back) and the typed text alone in the message's meta (app/main_window.py)."""
    if not docs:
        return text
    parts = [f"Document {i}: {d.name}\n\n{d.text.strip()}\n\nEnd of document {i}: {d.name}"
             for i, d in enumerate(docs, 1)]
    lead = "The user attached one document." if len(docs) == 1 else f"The user attached {len(docs)} documents."
    return "\n\n".join([lead] + parts + ([text] if text else []))


def attachment_meta(docs: list[Document]) -> list[dict]:
    """What a message's meta keeps of its documents: name, path and size (bytes), for its chips."""
    return [{"name": d.name, "path": str(d.path), "size": d.size} for d in docs]


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
