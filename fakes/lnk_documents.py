"""A fake of Link's document converter, ``lnk-documents`` (PROTOCOL.md §3.3).

    lnk-documents text FILE         (or: python -m fakes.lnk_documents text FILE)

Prints the text of FILE as UTF-8 and exits 0. By extension (any case):
``.html``/``.htm`` (tags stripped; head, scripts and styles dropped), ``.docx``,
``.odt``, ``.pptx``, ``.epub`` (text pulled from their XML parts), ``.pdf``
(the strings of ``Tj``/``TJ``/``'``/``"`` between ``BT`` and ``ET`` of its
content streams, plain or FlateDecode). An unknown extension or a corrupt
file: a message on stderr, exit 1. Bad usage: exit 2.

For tests, from the environment:
``FAKE_LNK_DOCUMENTS_LOG=FILE`` appends ``{"file", "status"}`` a run;
``FAKE_LNK_DOCUMENTS_DELAY=S`` sleeps S seconds first (to test time limits);
``FAKE_LNK_DOCUMENTS_FAIL=1`` fails every run (exit 1).

``make_pdf``, ``make_docx``, ``make_odt``, ``make_pptx`` and ``make_epub``
build small documents of a text, for tests.
"""

from __future__ import annotations

import html
import io
import json
import os
import posixpath
import re
import sys
import time
import zipfile
import zlib
from html.parser import HTMLParser
from xml.etree import ElementTree

SUPPORTED = (".html", ".htm", ".docx", ".odt", ".pptx", ".epub", ".pdf")


class Unreadable(Exception):
    """The file is corrupt or of a kind this converter does not know."""


# ---------------------------------------------------------------- HTML

BLOCK_TAGS = frozenset(
    "p div br li ul ol tr table h1 h2 h3 h4 h5 h6 title section article header footer "
    "blockquote pre dt dd hr body".split()
)
SKIPPED_TAGS = ("script", "style", "head")


class _HTMLText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in SKIPPED_TAGS:
            self._skip += 1
        elif tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in SKIPPED_TAGS:
            self._skip = max(0, self._skip - 1)
        elif tag in BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def html_text(markup: str) -> str:
    parser = _HTMLText()
    parser.feed(markup)
    parser.close()
    return _tidy("".join(parser.parts))


def _tidy(text: str) -> str:
    lines = [" ".join(line.split()) for line in text.splitlines()]
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip("\n")


# ---------------------------------------------------------------- zipped XML

_BREAK_RE = re.compile(r"</(?:w:p|a:p|text:p|text:h)>|<(?:w:br|w:cr|a:br|text:line-break)\b[^>]*>")
_TAB_RE = re.compile(r"<(?:w:tab|text:tab)\b[^>]*/>")
_SPACE_RE = re.compile(r"<text:s\b[^>]*/>")
_TAG_RE = re.compile(r"<[^>]*>")


def xml_text(xml: str) -> str:
    xml = _BREAK_RE.sub("\n", xml)
    xml = _TAB_RE.sub("\t", xml)
    xml = _SPACE_RE.sub(" ", xml)
    return _tidy(html.unescape(_TAG_RE.sub("", xml)))


def _member(zf: zipfile.ZipFile, name: str) -> str:
    try:
        return zf.read(name).decode("utf-8", errors="replace")
    except KeyError:
        raise Unreadable(f"no {name} in the archive") from None


def docx_text(zf: zipfile.ZipFile) -> str:
    return xml_text(_member(zf, "word/document.xml"))


def odt_text(zf: zipfile.ZipFile) -> str:
    return xml_text(_member(zf, "content.xml"))


def pptx_text(zf: zipfile.ZipFile) -> str:
    slides = [(int(m.group(1)), n) for n in zf.namelist()
              if (m := re.fullmatch(r"ppt/slides/slide(\d+)\.xml", n))]
    if not slides and "ppt/presentation.xml" not in zf.namelist():
        raise Unreadable("no slides in the archive")
    return "\n\n".join(xml_text(_member(zf, n)) for _, n in sorted(slides))


def epub_text(zf: zipfile.ZipFile) -> str:
    names = zf.namelist()
    chapters: list[str] = []
    try:
        container = ElementTree.fromstring(zf.read("META-INF/container.xml"))
        rootfile = next(e.get("full-path") for e in container.iter() if e.tag.endswith("rootfile"))
        opf = ElementTree.fromstring(zf.read(rootfile))
        base = posixpath.dirname(rootfile)
        hrefs = {e.get("id"): e.get("href") for e in opf.iter() if e.tag.endswith("}item") or e.tag == "item"}
        for ref in (e for e in opf.iter() if e.tag.endswith("itemref")):
            href = hrefs.get(ref.get("idref"))
            if href:
                chapters.append(posixpath.normpath(posixpath.join(base, href)))
    except (KeyError, StopIteration, ElementTree.ParseError, TypeError):
        chapters = sorted(n for n in names if n.lower().endswith((".xhtml", ".html", ".htm")))
    if not chapters:
        raise Unreadable("no chapters in the archive")
    return "\n\n".join(html_text(_member(zf, c)) for c in chapters)


ZIPPED = {".docx": docx_text, ".odt": odt_text, ".pptx": pptx_text, ".epub": epub_text}


# ---------------------------------------------------------------- PDF

_STREAM_RE = re.compile(rb"(?<!end)stream\r?\n")
_DELIMS = b"()<>[]{}/%"
_WS = b" \t\r\n\f\x00"
_ARRAY = object()  # marks where an array's operands begin


def pdf_text(data: bytes) -> str:
    if b"%PDF-" not in data[:1024]:
        raise Unreadable("not a PDF")
    if b"%%EOF" not in data[-2048:]:
        raise Unreadable("truncated PDF (no %%EOF)")
    texts = []
    for m in _STREAM_RE.finditer(data):
        end = data.find(b"endstream", m.end())
        if end < 0:
            raise Unreadable("a stream has no end")
        content = data[m.end():end]
        header = data[max(0, data.rfind(b"obj", 0, m.start())):m.start()]
        if b"/FlateDecode" in header:
            try:
                content = zlib.decompress(content.rstrip(b"\r\n"))
            except zlib.error:
                continue
        elif b"/Filter" in header:
            continue
        if b"BT" in content:
            texts.append(_content_text(content))
    return _tidy("\n".join(texts))


def _literal(data: bytes, i: int) -> tuple[bytes, int]:
    """The PDF literal string starting at data[i] == '(', and the index after it."""
    out = bytearray()
    depth = 1
    i += 1
    escapes = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("b"): b"\b", ord("f"): b"\f"}
    while i < len(data):
        c = data[i]
        if c == 0x5C:  # backslash
            i += 1
            if i >= len(data):
                break
            e = data[i]
            if e in escapes:
                out += escapes[e]
            elif 0x30 <= e <= 0x37:
                digits = data[i:i + 3]
                n = len(digits) - len(digits.lstrip(b"01234567"))
                out.append(int(digits[:n], 8) & 0xFF)
                i += n - 1
            elif e in (0x0D, 0x0A):  # line continuation
                if e == 0x0D and data[i + 1:i + 2] == b"\n":
                    i += 1
            else:
                out.append(e)
        elif c == 0x28:
            depth += 1
            out.append(c)
        elif c == 0x29:
            depth -= 1
            if depth == 0:
                return bytes(out), i + 1
            out.append(c)
        else:
            out.append(c)
        i += 1
    raise Unreadable("unterminated string in a content stream")


def _decode(s: bytes) -> str:
    if s.startswith(b"\xfe\xff"):
        return s[2:].decode("utf-16-be", errors="replace")
    return s.decode("latin-1")


def _content_text(data: bytes) -> str:
    out: list[str] = []
    operands: list = []
    in_text = False
    i, n = 0, len(data)
    while i < n:
        c = data[i:i + 1]
        if c in _WS:
            i += 1
        elif c == b"%":
            while i < n and data[i:i + 1] not in b"\r\n":
                i += 1
        elif c == b"(":
            s, i = _literal(data, i)
            operands.append(_decode(s))
        elif data[i:i + 2] in (b"<<", b">>"):
            i += 2
        elif c == b"<":
            end = data.find(b">", i)
            if end < 0:
                raise Unreadable("unterminated hex string")
            hexs = re.sub(rb"\s", b"", data[i + 1:end])
            try:
                operands.append(_decode(bytes.fromhex((hexs + b"0" * (len(hexs) % 2)).decode())))
            except ValueError:
                raise Unreadable("bad hex string") from None
            i = end + 1
        elif c == b"[":
            operands.append(_ARRAY)
            i += 1
        elif c == b"]":
            start = max((k for k, o in enumerate(operands) if o is _ARRAY), default=None)
            if start is not None:
                operands[start:] = [tuple(operands[start + 1:])]
            i += 1
        elif c in b"{}":
            i += 1
        else:
            j = i + 1 if c == b"/" else i
            while j < n and data[j:j + 1] not in _WS and data[j:j + 1] not in _DELIMS:
                j += 1
            token = data[i:j].decode("latin-1")
            i = max(j, i + 1)
            if token.startswith("/"):
                operands.append(token)
                continue
            try:
                operands.append(float(token))
                continue
            except ValueError:
                pass
            if token == "ID":  # inline image data: skip to EI
                end = data.find(b"EI", i)
                i = n if end < 0 else end + 2
            in_text = _operator(token, operands, out, in_text)
            operands = []
    return "".join(out)


def _operator(op: str, operands: list, out: list[str], in_text: bool) -> bool:
    if op == "BT":
        return True
    if op == "ET":
        out.append("\n")
        return False
    if not in_text:
        return in_text
    strings = [o for o in operands if isinstance(o, str) and not o.startswith("/")]
    if op in ("T*", "Tm") or (op in ("Td", "TD") and len(operands) >= 2 and operands[1] != 0):
        out.append("\n")
    elif op == "Tj" and strings:
        out.append(strings[-1])
    elif op in ("'", '"') and strings:
        out.append("\n" + strings[-1])
    elif op == "TJ":
        for arr in (o for o in operands if isinstance(o, tuple)):
            for item in arr:
                if isinstance(item, str):
                    out.append(item)
                elif isinstance(item, float) and item < -200:
                    out.append(" ")
    return in_text


# ---------------------------------------------------------------- converting


def convert(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in SUPPORTED:
        raise Unreadable(f"unsupported document type {ext or '(none)'}")
    with open(path, "rb") as f:
        data = f.read()
    if ext in (".html", ".htm"):
        return html_text(data.decode("utf-8", errors="replace"))
    if ext == ".pdf":
        return pdf_text(data)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            return ZIPPED[ext](zf)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as e:
        raise Unreadable(f"corrupt {ext[1:].upper()} ({e})") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "text":
        print("usage: lnk-documents text FILE", file=sys.stderr)
        return 2
    path = argv[1]
    if os.environ.get("FAKE_LNK_DOCUMENTS_DELAY"):
        time.sleep(float(os.environ["FAKE_LNK_DOCUMENTS_DELAY"]))
    status = 1
    try:
        if os.environ.get("FAKE_LNK_DOCUMENTS_FAIL"):
            raise Unreadable("failing as FAKE_LNK_DOCUMENTS_FAIL says")
        text = convert(path)
        sys.stdout.buffer.write(text.encode("utf-8") + (b"\n" if text else b""))
        sys.stdout.flush()
        status = 0
    except Unreadable as e:
        print(f"lnk-documents: {path}: {e}", file=sys.stderr)
    except OSError as e:
        print(f"lnk-documents: {path}: {e.strerror or e}", file=sys.stderr)
    finally:
        if os.environ.get("FAKE_LNK_DOCUMENTS_LOG"):
            with open(os.environ["FAKE_LNK_DOCUMENTS_LOG"], "a", encoding="utf-8") as log:
                log.write(json.dumps({"file": os.path.abspath(path), "status": status}) + "\n")
    return status


# ---------------------------------------------------------------- making test documents


def _pdf_string(line: str) -> bytes:
    try:
        raw = line.encode("latin-1")
    except UnicodeEncodeError:
        return b"<" + (b"\xfe\xff" + line.encode("utf-16-be")).hex().upper().encode() + b">"
    return b"(" + raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)") + b")"


def make_pdf(text: str, *, compress: bool = False) -> bytes:
    """A one-page PDF showing ``text``, a line a ``Tj`` (Unicode as UTF-16 hex strings)."""
    ops = [b"BT", b"/F1 12 Tf", b"14 TL", b"72 720 Td"]
    for k, line in enumerate(text.split("\n")):
        if k:
            ops.append(b"T*")
        ops.append(_pdf_string(line) + b" Tj")
    ops.append(b"ET")
    content = b"\n".join(ops) + b"\n"
    extra = b""
    if compress:
        content, extra = zlib.compress(content), b" /Filter /FlateDecode"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d%s >>\nstream\n" % (len(content), extra) + content + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for k, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % k + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def _zip(members: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, content in members.items():
            method = zipfile.ZIP_STORED if name == "mimetype" else zipfile.ZIP_DEFLATED
            zf.writestr(name, content, compress_type=method)
    return buf.getvalue()


def _x(text: str) -> str:
    return html.escape(text, quote=False)


def make_docx(text: str) -> bytes:
    """A DOCX with a paragraph a line of ``text``."""
    paras = "".join(f"<w:p><w:r><w:t xml:space=\"preserve\">{_x(p)}</w:t></w:r></w:p>" for p in text.split("\n"))
    return _zip({
        "[Content_Types].xml": '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
        '<Default Extension="xml" ContentType="application/xml"/>'
        '<Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>',
        "_rels/.rels": '<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="word/document.xml"/></Relationships>',
        "word/document.xml": '<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
        f"<w:body>{paras}</w:body></w:document>",
    })


def make_odt(text: str) -> bytes:
    """An ODT with a paragraph a line of ``text``."""
    paras = "".join(f"<text:p>{_x(p)}</text:p>" for p in text.split("\n"))
    return _zip({
        "mimetype": "application/vnd.oasis.opendocument.text",
        "META-INF/manifest.xml": '<?xml version="1.0" encoding="UTF-8"?><manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0">'
        '<manifest:file-entry manifest:full-path="/" manifest:media-type="application/vnd.oasis.opendocument.text"/>'
        '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/></manifest:manifest>',
        "content.xml": '<?xml version="1.0" encoding="UTF-8"?><office:document-content xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
        'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"><office:body><office:text>'
        f"{paras}</office:text></office:body></office:document-content>",
    })


def make_pptx(slides: list[str]) -> bytes:
    """A PPTX with one slide a string, a paragraph a line."""
    members = {
        "[Content_Types].xml": '<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="xml" ContentType="application/xml"/></Types>',
        "ppt/presentation.xml": '<?xml version="1.0" encoding="UTF-8"?><p:presentation xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main"/>',
    }
    for k, slide in enumerate(slides, 1):
        paras = "".join(f"<a:p><a:r><a:t>{_x(p)}</a:t></a:r></a:p>" for p in slide.split("\n"))
        members[f"ppt/slides/slide{k}.xml"] = (
            '<?xml version="1.0" encoding="UTF-8"?><p:sld xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" '
            'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"><p:cSld><p:spTree><p:sp><p:txBody>'
            f"{paras}</p:txBody></p:sp></p:spTree></p:cSld></p:sld>")
    return _zip(members)


def make_epub(chapters: list[str], title: str = "Test book") -> bytes:
    """An EPUB with one XHTML chapter a string, a paragraph a line."""
    members = {
        "mimetype": "application/epub+zip",
        "META-INF/container.xml": '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
        '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/></rootfiles></container>',
    }
    items, spine = [], []
    for k, chapter in enumerate(chapters, 1):
        body = "".join(f"<p>{_x(p)}</p>" for p in chapter.split("\n"))
        members[f"OEBPS/ch{k}.xhtml"] = (
            f'<?xml version="1.0" encoding="UTF-8"?><html xmlns="http://www.w3.org/1999/xhtml"><head><title>{_x(title)}</title>'
            f"</head><body>{body}</body></html>")
        items.append(f'<item id="ch{k}" href="ch{k}.xhtml" media-type="application/xhtml+xml"/>')
        spine.append(f'<itemref idref="ch{k}"/>')
    members["OEBPS/content.opf"] = (
        '<?xml version="1.0" encoding="UTF-8"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0">'
        f'<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>{_x(title)}</dc:title></metadata>'
        f"<manifest>{''.join(items)}</manifest><spine>{''.join(spine)}</spine></package>")
    return _zip(members)


if __name__ == "__main__":
    sys.exit(main())
