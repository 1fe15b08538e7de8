"""Documents never hurt the window (issue 15): parses of PDF and DOCX run in a child process that
is killed at the time limit, DOCX inflation and text are capped, encodings are detected, PDFs with
an empty user password open, and the token fitting reads only what it needs."""
import multiprocessing
import time
import zipfile

import pytest

from app.chat import documents
from app.chat.documents import DocumentError


def bomb_docx(path, inflated_mb: int):
    """A valid .docx whose document.xml inflates to about `inflated_mb` MB of paragraphs."""
    import docx

    d = docx.Document()
    d.add_paragraph("seed")
    d.save(str(path))
    with zipfile.ZipFile(path) as z:
        parts = {i.filename: z.read(i.filename) for i in z.infolist()}
    xml = parts["word/document.xml"].decode()
    head, tail = xml.split("<w:body>", 1)
    para = "<w:p><w:r><w:t>All work and no play makes Jack a dull boy.</w:t></w:r></w:p>"
    n = inflated_mb * 2**20 // len(para)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name, data in parts.items():
            if name != "word/document.xml":
                z.writestr(name, data)
        with z.open("word/document.xml", "w") as f:
            f.write((head + "<w:body>").encode())
            block = (para * 1000).encode()
            for _ in range(n // 1000):
                f.write(block)
            f.write(tail.encode())
    return path


def test_docx_paragraph_bomb_is_refused_in_time_and_the_reader_is_gone(tmp_path):
    path = bomb_docx(tmp_path / "bomb.docx", 300)
    assert path.stat().st_size < 2 * 2**20  # small on disk
    t0 = time.perf_counter()
    with pytest.raises(DocumentError, match="inflates to"):
        documents.parse_later(path).result()
    assert time.perf_counter() - t0 < documents.TIME_LIMIT_S
    assert not multiprocessing.active_children()


def test_a_parse_past_the_time_limit_is_killed(tmp_path):
    path = bomb_docx(tmp_path / "slow.docx", 60)  # under the cap, but python-docx takes long
    t0 = time.perf_counter()
    with pytest.raises(DocumentError, match="took longer than"):
        documents.parse_in_child(path, time_limit_s=1.0)
    assert time.perf_counter() - t0 < 8
    assert not multiprocessing.active_children()  # killed, not abandoned


@pytest.mark.parametrize("encoding", ["utf-16", "latin-1", "utf-8-sig", "cp1252"])
def test_text_encodings_are_detected(tmp_path, encoding):
    text = "Café, crème brûlée et pâtisserie: la cuisine française. " * 40
    p = tmp_path / f"notes-{encoding}.txt"
    p.write_bytes(text.encode(encoding))
    assert documents.parse(p).text.strip() == text.strip()


def test_binary_is_still_refused(tmp_path):
    import os

    p = tmp_path / "blob.txt"
    p.write_bytes(os.urandom(50_000))
    with pytest.raises(DocumentError, match="binary"):
        documents.parse(p)


def encrypted_pdf(path, user_password: str, text: str):
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_encryption(owner_password="owner-secret", user_password=user_password)
    pdf.add_page()
    pdf.set_font("Helvetica", size=12)
    pdf.multi_cell(0, 8, text)
    pdf.output(str(path))
    return path


def test_pdf_with_an_empty_user_password_opens(tmp_path):
    doc = documents.parse_in_child(encrypted_pdf(tmp_path / "locked.pdf", "", "Experts are chosen per token by a router."))
    assert "router" in doc.text


def test_pdf_with_a_real_password_is_refused(tmp_path):
    with pytest.raises(DocumentError, match="password"):
        documents.parse_in_child(encrypted_pdf(tmp_path / "secret.pdf", "user-secret", "secret"))


def test_fit_reads_only_a_prefix_of_a_huge_text(tmp_path):
    calls = []

    def count(text):
        calls.append(len(text))
        return len(text) // 4

    doc = documents.Document(tmp_path / "big.txt", "word " * 4_000_000, 20_000_000)
    f = documents.fit(doc, 1000, count)
    assert not f.exact and f.tokens > 1000 and f.part is not None and count(f.part.text) <= 1000
    assert max(calls) <= 16 * 1000


def test_attachments_need_no_model(qtbot, tmp_path):
    """The attachment row on its own: no engine, no model (issue 15's split of the window)."""
    from app.chat.attachments import Attachments

    row = Attachments()
    qtbot.addWidget(row)
    (tmp_path / "notes.txt").write_text("plain notes")
    import docx

    d = docx.Document()
    d.add_paragraph("a paragraph from a report")
    d.save(str(tmp_path / "report.docx"))
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 100)
    errors = []
    row.notice.connect(errors.append)
    for name in ("notes.txt", "report.docx", "blob.bin"):
        row.attach(str(tmp_path / name))
    qtbot.waitUntil(lambda: len(row.chip_widgets()) == 2 and bool(errors), timeout=30_000)
    assert sorted(doc.name for doc in row.docs) == ["notes.txt", "report.docx"]
    assert "blob.bin" in errors[0] and "binary" in errors[0]
    row.set_context(64, lambda text: len(text))  # a context of 64 "tokens": the report fits, a long file does not
    (tmp_path / "long.txt").write_text("x" * 500)
    row.attach(str(tmp_path / "long.txt"))
    qtbot.waitUntil(lambda: row.too_long_box is not None, timeout=30_000)
    row.too_long_box.done(row.too_long_box.StandardButton.Yes)
    qtbot.waitUntil(lambda: len(row.chip_widgets()) == 3, timeout=10_000)
    assert len(row.docs[-1].text) <= row.room
