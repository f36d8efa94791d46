from knowledge.chunking import MAX_CHARS, TARGET_CHARS, chunk_text


def test_short_text_is_one_chunk():
    assert chunk_text("  One paragraph.\n\nAnother one.  ") == ["One paragraph.\n\nAnother one."]


def test_paragraphs_are_packed_up_to_the_target():
    paragraphs = [f"Paragraph {i} " + "word " * 60 for i in range(20)]
    chunks = chunk_text("\n\n".join(paragraphs))
    assert len(chunks) > 1
    assert all(len(chunk) <= MAX_CHARS for chunk in chunks)
    assert all(len(chunk) >= TARGET_CHARS // 2 for chunk in chunks[:-1])
    assert "".join(chunks).replace("\n\n", "").replace(" ", "") == "".join(paragraphs).replace(" ", "")


def test_long_paragraphs_are_cut_at_sentences_and_words():
    sentences = " ".join(f"Sentence number {i} says something about retrieval." for i in range(80))
    no_spaces = "x" * (MAX_CHARS * 2 + 10)
    for text in (sentences, "word " * 1000, no_spaces):
        chunks = chunk_text(text)
        assert len(chunks) > 1 and all(0 < len(chunk) <= MAX_CHARS for chunk in chunks)
        assert "".join(chunks).replace(" ", "").replace("\n", "") == text.replace(" ", "")


def test_blank_text_has_no_chunks():
    assert chunk_text(" \n\n \n") == []
