"""Split a document's text into retrieval chunks: paragraphs packed up to a target size."""
import re

TARGET_CHARS = 1000  # a chunk grows paragraph by paragraph until it reaches this
MAX_CHARS = 1600  # a paragraph longer than this is cut at sentence (or word) boundaries

_PARAGRAPH = re.compile(r"\n\s*\n")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def _pieces(paragraph: str) -> list[str]:
    if len(paragraph) <= MAX_CHARS:
        return [paragraph]
    pieces, current = [], ""
    for sentence in _SENTENCE.split(paragraph):
        while len(sentence) > MAX_CHARS:  # one enormous sentence: cut at a space
            cut = sentence.rfind(" ", 0, MAX_CHARS)
            cut = cut if cut > 0 else MAX_CHARS
            if current:
                pieces.append(current)
                current = ""
            pieces.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if current and len(current) + 1 + len(sentence) > MAX_CHARS:
            pieces.append(current)
            current = sentence
        else:
            current = f"{current} {sentence}".strip()
    if current:
        pieces.append(current)
    return pieces


def chunk_text(text: str) -> list[str]:
    """Chunks in document order; never empty for a text with any non-space character."""
    chunks: list[str] = []
    current = ""
    for paragraph in _PARAGRAPH.split(text.strip()):
        paragraph = paragraph.strip()
        if not paragraph:
            continue
        for piece in _pieces(paragraph):
            if current and len(current) + 2 + len(piece) > MAX_CHARS:
                chunks.append(current)
                current = piece
            else:
                current = f"{current}\n\n{piece}" if current else piece
            if len(current) >= TARGET_CHARS:
                chunks.append(current)
                current = ""
    if current:
        chunks.append(current)
    return chunks
