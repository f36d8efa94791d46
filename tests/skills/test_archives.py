"""Skill uploads (skills.archives): zip archives and browser folder uploads are hostile until proven
otherwise. Every attack is refused with its own message, and nothing is read that should not be."""
import builtins
import io
import os
import stat
import struct
import tracemalloc
import unicodedata
import warnings
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skills import archives
from skills.archives import MAX_ARCHIVE_BYTES, MAX_CENTRAL_DIRECTORY_BYTES, package_from_upload, package_from_zip
from skills.packages import (
    MAX_ENTRIES,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_PATH_CHARS,
    MAX_TOTAL_BYTES,
    PackageProblems,
    package_from_files,
)
from tests.skills.test_packages import ATTACKS, skill_md

SKILL = skill_md()


def make_zip(entries, *, compression=zipfile.ZIP_DEFLATED) -> bytes:
    """entries: (name or ZipInfo, data); duplicates allowed on purpose."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name"
        with zipfile.ZipFile(buffer, "w", compression) as archive:
            for name, data in entries:
                archive.writestr(name, data)
    return buffer.getvalue()


def entry(name: str, *, mode: int | None = None, compression=zipfile.ZIP_DEFLATED) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.compress_type = compression
    if mode is not None:
        info.external_attr = mode << 16
    return info


def central_headers(data: bytes):
    """(offset, name) of each central directory header."""
    offset = zipfile.ZipFile(io.BytesIO(data)).start_dir
    while data[offset:offset + 4] == b"PK\x01\x02":
        name_length, extra_length, comment_length = struct.unpack_from("<3H", data, offset + 28)
        yield offset, data[offset + 46:offset + 46 + name_length]
        offset += 46 + name_length + extra_length + comment_length


def patch_central(data: bytes, name: bytes, at: int, fmt: str, value) -> bytes:
    """Set a field of `name`'s central directory header (flags at 8, sizes at 20/24, attributes at 38)."""
    patched = bytearray(data)
    for offset, found in central_headers(data):
        if found == name:
            struct.pack_into(fmt, patched, offset + at, value)
            return bytes(patched)
    raise AssertionError(f"no entry {name!r}")


def refused(data: bytes, **kwargs) -> list[str]:
    with pytest.raises(PackageProblems) as caught:
        package_from_zip(data, **kwargs)
    return caught.value.problems


def upload_refused(files, **kwargs) -> list[str]:
    with pytest.raises(PackageProblems) as caught:
        package_from_upload(files, **kwargs)
    return caught.value.problems


# --- good archives ------------------------------------------------------------------------------------

def test_skill_md_at_the_root():
    package = package_from_zip(make_zip([("SKILL.md", SKILL), ("references/", b""), ("references/a.md", b"A")]))
    assert package.name == "demo-skill"
    assert package.files == {"SKILL.md": SKILL, "references/a.md": b"A"}
    assert package == package_from_files({"SKILL.md": SKILL, "references/a.md": b"A"})


def test_a_wrapping_folder_names_the_skill():
    data = make_zip([("demo-skill/", b""), ("demo-skill/SKILL.md", SKILL), ("demo-skill/references/", b""),
                     ("demo-skill/references/a.md", b"A"), ("__MACOSX/demo-skill/._SKILL.md", b"\0\x05\x16\x07")])
    package = package_from_zip(data)
    assert package.name == "demo-skill" and sorted(package.files) == ["SKILL.md", "references/a.md"]
    assert package_from_zip(data, folder="demo-skill") == package


def test_the_wrapping_folder_must_match_the_skill():
    data = make_zip([("my-skill/SKILL.md", SKILL)])
    assert refused(data) == ['name "demo-skill" must equal the folder name "my-skill"']
    assert refused(make_zip([("demo-skill/SKILL.md", SKILL)]), folder="other-skill") == [
        'the archive\'s folder "demo-skill" must be named "other-skill", like the skill']


def test_without_a_wrapping_folder_the_folder_argument_is_the_name():
    data = make_zip([("SKILL.md", SKILL)])
    assert package_from_zip(data, folder="demo-skill").name == "demo-skill"
    assert refused(data, folder="other-skill") == ['name "demo-skill" must equal the folder name "other-skill"']


def test_stored_members_nested_archives_and_binary_files_are_plain_files():
    inner = make_zip([("../../evil", b"never opened")])
    package = package_from_zip(make_zip([("SKILL.md", SKILL), ("data/inner.zip", inner), ("img.png", b"\x89PNG\0")],
                                        compression=zipfile.ZIP_STORED))
    assert package.files["data/inner.zip"] == inner
    assert package.resource_paths() == ["data/inner.zip", "img.png"]


def test_utf8_names_without_the_utf8_flag_are_read_as_utf8():
    """macOS and many tools write UTF-8 names without setting the flag; zipfile would read them as cp437."""
    data = make_zip([("SKILL.md", SKILL), ("notes/cafXY.md", b"menu")]).replace(b"cafXY", "café".encode())
    assert sorted(package_from_zip(data).files) == ["SKILL.md", "notes/café.md"]


def test_nothing_is_written_anywhere(monkeypatch):
    data = make_zip([("demo-skill/SKILL.md", SKILL), ("demo-skill/a.md", b"A")])

    def no_files(*args, **kwargs):
        raise AssertionError("an upload must not touch the file system")

    monkeypatch.setattr(builtins, "open", no_files)
    monkeypatch.setattr(os, "open", no_files)
    assert package_from_zip(data).name == "demo-skill"
    assert package_from_upload([("demo-skill/SKILL.md", SKILL)]).name == "demo-skill"
    assert refused(make_zip([("SKILL.md", SKILL), ("../x", b"x")]))


@settings(deadline=None, max_examples=40)
@given(st.dictionaries(st.from_regex(r"[a-z0-9_-]{1,8}(/[a-z0-9_-]{1,8}){0,2}\.(md|txt|csv)", fullmatch=True),
                       st.binary(max_size=64), max_size=6).filter(lambda files: "skill.md" not in files))
def test_a_zip_holds_what_its_files_hold(resources):
    files = {"SKILL.md": SKILL, **resources}
    assert package_from_zip(make_zip(list(files.items()))) == package_from_files(files)
    wrapped = [(f"demo-skill/{path}", data) for path, data in files.items()]
    assert package_from_zip(make_zip(wrapped)) == package_from_upload(wrapped) == package_from_files(files)


# --- not a zip ----------------------------------------------------------------------------------------

def test_not_a_zip():
    assert refused(b"hello, I am a text file") == ["the upload is not a zip archive"]
    assert refused(b"") == ["the upload is empty"]
    assert refused(make_zip([("SKILL.md", SKILL)])[:-10]) == ["the upload is not a zip archive"]


def test_a_corrupt_zip():
    data = make_zip([("SKILL.md", SKILL)])
    (offset, _), = central_headers(data)
    broken = data[:offset] + b"XX" + data[offset + 2:]
    assert refused(broken) == ["the archive is corrupt: Bad magic number for central directory"]


def test_a_corrupt_member():
    data = patch_central(make_zip([("SKILL.md", SKILL)]), b"SKILL.md", 16, "<L", 0xDEADBEEF)
    assert refused(data) == ["entry \"SKILL.md\" is corrupt: Bad CRC-32 for file 'SKILL.md'"]


def test_an_archive_too_large_is_refused_unread(monkeypatch):
    monkeypatch.setattr(archives.zipfile, "ZipFile", None)  # never reached
    assert refused(b"\0" * (MAX_ARCHIVE_BYTES + 1)) == [
        f"the archive is {MAX_ARCHIVE_BYTES + 1} bytes; at most {MAX_ARCHIVE_BYTES}"]


# --- paths ------------------------------------------------------------------------------------------

ZIP_ATTACKS = ["../x", "a/../../x", "/etc/passwd", "C:\\x", "a\\..\\b", "%2e%2e/x", "\uff0e\uff0e/x",
               "\u2024\u2024/x", "..\u2215x", "evil\u202egnp.md", "...", "file.md:stream"]


@pytest.mark.parametrize("path", ZIP_ATTACKS)
def test_traversal_in_an_archive_is_refused(path):
    assert refused(make_zip([("SKILL.md", SKILL), (path, b"x")])) == [dict(ATTACKS)[path]]


@pytest.mark.parametrize("path", ["demo-skill/../x", "demo-skill/a/../../x", "demo-skill/\uff0e\uff0e/x"])
def test_traversal_inside_a_wrapping_folder_is_refused(path):
    assert refused(make_zip([("demo-skill/SKILL.md", SKILL), (path, b"x")])) == [
        dict(ATTACKS)[path.removeprefix("demo-skill/")].replace('path "', 'path "demo-skill/', 1)]


def test_a_nul_in_a_name_is_refused():
    """zipfile cuts names at a NUL ("abc" here); the name as stored is checked."""
    data = make_zip([("SKILL.md", SKILL), ("abcXdef.md", b"x")]).replace(b"abcXdef.md", b"abc\x00def.md")
    assert refused(data) == ['path "abc\\u0000def.md" contains a NUL character']


def test_traversal_in_a_folder_entry_is_refused():
    assert refused(make_zip([("SKILL.md", SKILL), ("../outside/", b"")])) == [
        "path \"../outside\" leaves the skill folder ('..')"]


def test_every_bad_entry_is_listed():
    data = make_zip([("SKILL.md", SKILL), ("../x", b"x"), ("/etc/passwd", b"x"),
                     (entry("link", mode=stat.S_IFLNK | 0o777), b"/etc/shadow")])
    assert refused(data) == ["path \"../x\" leaves the skill folder ('..')",
                             "path \"/etc/passwd\" is absolute (it starts with '/')",
                             'entry "link" is a symbolic link; only regular files and folders are allowed']


def test_bad_entries_and_a_bad_front_matter_are_reported_together():
    bad = skill_md("name: Bad Name\ndescription: ''\nauthor: me")
    expected = ["path \"../evil.md\" leaves the skill folder ('..')",
                'unknown front matter field "author" (allowed: name, description, license, compatibility, '
                "metadata, allowed-tools)",
                'name "Bad Name" must be lowercase letters, digits and hyphens',
                "description is empty"]
    assert refused(make_zip([("SKILL.md", bad), ("../evil.md", b"x")])) == expected
    assert upload_refused([("SKILL.md", bad), ("../evil.md", b"x")]) == expected


# --- entry types and flags -------------------------------------------------------------------------

@pytest.mark.parametrize(("mode", "kind"), [
    (stat.S_IFLNK | 0o777, "a symbolic link"),
    (stat.S_IFCHR | 0o600, "a character device"),
    (stat.S_IFBLK | 0o600, "a block device"),
    (stat.S_IFIFO | 0o600, "a FIFO (named pipe)"),
    (stat.S_IFSOCK | 0o600, "a socket"),
])
def test_links_and_special_files_are_refused(mode, kind):
    data = make_zip([("SKILL.md", SKILL), (entry("references/x", mode=mode), b"../../../etc/passwd")])
    assert refused(data) == [f'entry "references/x" is {kind}; only regular files and folders are allowed']


def test_regular_files_and_folders_with_unix_modes_are_fine():
    package = package_from_zip(make_zip([(entry("SKILL.md", mode=stat.S_IFREG | 0o644), SKILL),
                                         (entry("bin/", mode=stat.S_IFDIR | 0o755), b""),
                                         (entry("bin/run.sh", mode=stat.S_IFREG | 0o755), b"echo")]))
    assert sorted(package.files) == ["SKILL.md", "bin/run.sh"]


def test_a_folder_entry_carries_no_data():
    assert refused(make_zip([("SKILL.md", SKILL), ("references/", b"hidden payload")])) == [
        'folder entry "references" carries data']


def test_encrypted_entries_are_refused():
    data = make_zip([("SKILL.md", SKILL), ("secret.md", b"x")])
    assert refused(patch_central(data, b"secret.md", 8, "<H", 0x1)) == [
        'entry "secret.md" is encrypted; upload the archive without a password']
    assert refused(patch_central(data, b"secret.md", 8, "<H", 0x41)) == [
        'entry "secret.md" is encrypted; upload the archive without a password']


def test_other_compression_methods_are_refused():
    data = make_zip([("SKILL.md", SKILL), (entry("a.md", compression=zipfile.ZIP_BZIP2), b"x" * 100)])
    assert refused(data) == ['entry "a.md" uses compression method 12; only stored and deflate are accepted']


# --- duplicates -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("names", "problem"), [
    (["a.md", "a.md"], 'path "a.md" appears more than once'),
    (["skill.md"], 'path "skill.md" clashes with "SKILL.md" (they differ only in case)'),
    (["Notes.md", "NOTES.md"], 'path "NOTES.md" clashes with "Notes.md" (they differ only in case)'),
    (["a/b.md", "a/./b.md"], 'path "a/./b.md" appears more than once'),
    (["a/b.md", "a//b.md"], 'path "a//b.md" appears more than once'),
    (["café.md", unicodedata.normalize("NFD", "café.md")],
     f'path "{unicodedata.normalize("NFD", "café.md")}" appears more than once'),
])
def test_duplicate_paths_are_refused(names, problem):
    assert refused(make_zip([("SKILL.md", SKILL), *[(name, b"x") for name in names]])) == [problem]
    assert upload_refused([("SKILL.md", SKILL), *[(name, b"x") for name in names]]) == [problem]


# --- limits and bombs -------------------------------------------------------------------------------

def test_too_many_entries_are_refused_before_the_directory_is_parsed(monkeypatch):
    data = make_zip([("SKILL.md", SKILL), *[(f"d{i}/", b"") for i in range(MAX_ENTRIES)]])
    monkeypatch.setattr(archives.zipfile, "ZipFile", None)  # parsing the directory would fail loudly
    assert refused(data) == [f"the archive has {MAX_ENTRIES + 1} entries; at most {MAX_ENTRIES}"]


def test_an_end_record_that_understates_the_entries_is_caught_after_parsing():
    data = bytearray(make_zip([("SKILL.md", SKILL), *[(f"d{i}/", b"") for i in range(MAX_ENTRIES)]]))
    end = data.rfind(b"PK\x05\x06")
    struct.pack_into("<2H", data, end + 8, 1, 1)
    assert refused(bytes(data)) == [f"the archive has {MAX_ENTRIES + 1} entries; at most {MAX_ENTRIES}"]


def test_zip64_end_records_are_read_too(monkeypatch):
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 0)  # makes zipfile write the ZIP64 end records
    data = make_zip([("SKILL.md", SKILL)])
    monkeypatch.undo()
    assert b"PK\x06\x06" in data and package_from_zip(data).name == "demo-skill"
    forged = bytearray(data)
    struct.pack_into("<2Q", forged, forged.rfind(b"PK\x06\x06") + 24, 10**6, 10**6)
    assert refused(bytes(forged)) == [f"the archive has 1000000 entries; at most {MAX_ENTRIES}"]


def test_too_large_a_central_directory_is_refused():
    data = bytearray(make_zip([("SKILL.md", SKILL)]))
    struct.pack_into("<L", data, data.rfind(b"PK\x05\x06") + 12, MAX_CENTRAL_DIRECTORY_BYTES + 1)
    assert refused(bytes(data)) == [f"the archive's directory is {MAX_CENTRAL_DIRECTORY_BYTES + 1} bytes; "
                                    f"at most {MAX_CENTRAL_DIRECTORY_BYTES}"]


def test_too_many_files():
    data = make_zip([("SKILL.md", SKILL), *[(f"r/{i}.md", b"") for i in range(MAX_FILES)]])
    assert refused(data) == [f"the archive has {MAX_FILES + 1} files; at most {MAX_FILES}"]


def zeros_member(archive: zipfile.ZipFile, name: str, size: int) -> None:
    """A member of `size` zero bytes, written in chunks (memory-light, compresses ~1000:1)."""
    chunk = bytes(1024 * 1024)
    with archive.open(entry(name), "w", force_zip64=size > 0x7FFFFFFF) as stream:
        for start in range(0, size, len(chunk)):
            stream.write(chunk[:min(len(chunk), size - start)])


def zip_of_zeros(sizes: dict[str, int]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("SKILL.md", SKILL)
        for name, size in sizes.items():
            zeros_member(archive, name, size)
    return buffer.getvalue()


def test_too_large_a_member_is_refused_by_its_declared_size_unread(monkeypatch):
    data = zip_of_zeros({"big.bin": 50 * 1024 * 1024})
    assert len(data) < 100 * 1024
    opened, real_open = [], zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open",
                        lambda self, info, *a, **k: opened.append(info.filename) or real_open(self, info))
    assert refused(data) == [f'file "big.bin" is {50 * 1024 * 1024} bytes; at most {MAX_FILE_BYTES}']
    assert opened == ["SKILL.md"]  # (read to report its own problems too; big.bin never)


def test_a_refused_skill_md_is_not_also_reported_missing():
    data = make_zip([("SKILL.md", SKILL)])
    assert refused(patch_central(data, b"SKILL.md", 8, "<H", 0x1)) == [
        'entry "SKILL.md" is encrypted; upload the archive without a password']
    wrapped = make_zip([("demo-skill/SKILL.md", SKILL), ("demo-skill/a.md", b"")])
    assert refused(patch_central(wrapped, b"demo-skill/SKILL.md", 8, "<H", 0x1)) == [
        'entry "demo-skill/SKILL.md" is encrypted; upload the archive without a password']
    assert upload_refused([("SKILL.md", bytes(MAX_FILE_BYTES + 1))]) == [
        f'file "SKILL.md" is {MAX_FILE_BYTES + 1} bytes; at most {MAX_FILE_BYTES}']


def test_too_large_a_total_is_refused_unread(monkeypatch):
    parts = MAX_TOTAL_BYTES // MAX_FILE_BYTES + 1
    data = zip_of_zeros({f"part{i}.bin": MAX_FILE_BYTES for i in range(parts)})
    monkeypatch.setattr(zipfile.ZipFile, "open", None)
    assert refused(data) == [f"the files add up to {parts * MAX_FILE_BYTES + len(SKILL)} bytes; "
                             f"at most {MAX_TOTAL_BYTES}"]


def test_a_high_compression_ratio_is_refused():
    data = zip_of_zeros({"a.bin": 900 * 1024, "b.bin": 900 * 1024})
    (problem,) = refused(data)
    assert problem.startswith("the archive inflates ") and problem.endswith(
        f"to {1800 * 1024 + len(SKILL)} (more than 100 times): it looks like a zip bomb")


def test_a_member_lying_about_its_size_inflates_no_further_than_it_declared():
    """A bomb: 64 MiB of zeros declared as 1,000 bytes. It is read no further than the declared size,
    and refused (the data does not match)."""
    data = zip_of_zeros({"bomb.txt": 64 * 1024 * 1024})
    local = zipfile.ZipFile(io.BytesIO(data)).getinfo("bomb.txt").header_offset
    data = patch_central(data, b"bomb.txt", 24, "<L", 1000)  # the size in the central directory …
    data = data[:local + 22] + struct.pack("<L", 1000) + data[local + 26:]  # … and in the local header
    tracemalloc.start()
    try:
        problems = refused(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert problems == ["entry \"bomb.txt\" is corrupt: Bad CRC-32 for file 'bomb.txt'"]
    assert peak < 4 * 1024 * 1024


class EndlessStream:
    """What a decompressor that ignores the declared size would hand back: zeros, forever."""

    def __init__(self):
        self.read_bytes = 0

    def read(self, size=-1):
        self.read_bytes += size
        return bytes(size)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_members_are_read_under_a_hard_cap_whatever_the_archive_says(monkeypatch):
    data = make_zip([("SKILL.md", SKILL), ("a.md", b"0123456789")])
    stream = EndlessStream()
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open",
                        lambda self, info, *a, **k: stream if info.filename == "a.md" else real_open(self, info))
    assert refused(data) == [
        'entry "a.md" inflates beyond its declared 10 bytes (a zip bomb?)']
    assert stream.read_bytes == archives.CHUNK_BYTES  # stopped at the first chunk past the cap


def test_a_member_shorter_than_declared_is_refused(monkeypatch):
    data = make_zip([("SKILL.md", SKILL)])
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, info, *a, **k: io.BytesIO(b"short"))
    assert refused(data) == ['entry "SKILL.md" holds 5 bytes, not the '
                                                         f'{len(SKILL)} it declares']


# --- what is inside ---------------------------------------------------------------------------------

def test_missing_skill_md():
    assert refused(make_zip([("README.md", b"# hi")])) == [
        "SKILL.md is missing: put it at the top of the archive, or in a single folder that holds everything"]
    assert refused(make_zip([("a/b/SKILL.md", SKILL)])) == [
        "SKILL.md is missing: put it at the top of the archive, or in a single folder that holds everything "
        '(found "a/b/SKILL.md")']
    assert refused(make_zip([("x/SKILL.md", SKILL), ("y/a.md", b"")])) == [
        "SKILL.md is missing: put it at the top of the archive, or in a single folder that holds everything "
        '(found "x/SKILL.md")']


def test_a_non_utf8_skill_md():
    data = make_zip([("SKILL.md", "---\nname: demo-skill\ndescription: Café\n---\n".encode("latin-1"))])
    assert refused(data) == ["SKILL.md is not valid UTF-8 (byte 0xe9 at offset 37); save it as UTF-8"]


def test_a_yaml_bomb_in_an_archive():
    levels = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    data = make_zip([("SKILL.md", skill_md("\n".join([*levels, "name: demo-skill", "description: d"])))])
    assert refused(data) == ["front matter uses YAML anchors or aliases (&name, *name); write the values out"]


def test_a_front_matter_list_in_an_archive():
    assert refused(make_zip([("SKILL.md", skill_md("- a\n- b"))])) == [
        "front matter must be a YAML mapping of fields, not a list"]


# --- a set of files (a browser's folder upload) ---------------------------------------------------

def test_a_folder_upload():
    package = package_from_upload([("demo-skill/SKILL.md", SKILL), ("demo-skill/references/a.md", b"A"),
                                   ("__MACOSX/demo-skill/._a.md", b"")])
    assert package.name == "demo-skill" and sorted(package.files) == ["SKILL.md", "references/a.md"]
    assert package_from_upload([("SKILL.md", SKILL), ("references/a.md", b"A")]) == package


@pytest.mark.parametrize("path", ZIP_ATTACKS + ["a\x00b"])
def test_traversal_in_an_upload_is_refused(path):
    assert upload_refused([("SKILL.md", SKILL), (path, b"x")]) == [dict(ATTACKS)[path]]


def test_upload_limits_and_shapes():
    assert upload_refused([]) == ["the upload has no files"]
    assert upload_refused([("SKILL.md", SKILL)] * (MAX_FILES + 1)) == [
        f"the upload has {MAX_FILES + 1} files; at most {MAX_FILES}"]
    assert upload_refused([("SKILL.md", SKILL), ("big.bin", bytes(MAX_FILE_BYTES + 1))]) == [
        f'file "big.bin" is {MAX_FILE_BYTES + 1} bytes; at most {MAX_FILE_BYTES}']
    assert upload_refused([("SKILL.md", SKILL), ("a.md", "text")]) == ['file "a.md" is not bytes']
    assert upload_refused([("SKILL.md", SKILL), ("a.md",)]) == ["each uploaded file must be a (path, content) pair"]
    assert upload_refused([("demo-skill/SKILL.md", SKILL)], folder="other-skill") == [
        'the archive\'s folder "demo-skill" must be named "other-skill", like the skill']


def test_an_upload_lists_every_problem_and_reads_on_past_each():
    problems = upload_refused([("x.md",), ("../x", b"x"), ("a.md", "text"), ("c.md", b"1"), ("C.md", b"2"),
                               ("big.bin", bytes(MAX_FILE_BYTES + 1)), ("SKILL.md", SKILL)])
    assert problems == ["each uploaded file must be a (path, content) pair", dict(ATTACKS)["../x"],
                        'file "a.md" is not bytes', 'path "C.md" clashes with "c.md" (they differ only in case)',
                        f'file "big.bin" is {MAX_FILE_BYTES + 1} bytes; at most {MAX_FILE_BYTES}']


def test_an_upload_at_every_limit_is_accepted():
    """MAX_FILES files, one of them MAX_FILE_BYTES, MAX_TOTAL_BYTES in all: each limit is inclusive."""
    full = [(f"full{i}.bin", bytes(MAX_FILE_BYTES)) for i in range(7)]
    rest = MAX_TOTAL_BYTES - 7 * MAX_FILE_BYTES - len(SKILL)
    empty = [(f"r/{i}.md", b"") for i in range(MAX_FILES - len(full) - 2)]
    package = package_from_upload([("SKILL.md", SKILL), *full, ("rest.bin", bytes(rest)), *empty])
    assert len(package.files) == MAX_FILES
    assert sum(len(content) for content in package.files.values()) == MAX_TOTAL_BYTES


def test_an_upload_over_the_total_is_refused_with_its_size():
    files = [("SKILL.md", SKILL), *[(f"{i}.bin", bytes(MAX_FILE_BYTES)) for i in range(8)]]
    assert upload_refused(files) == [
        f"the files add up to {8 * MAX_FILE_BYTES + len(SKILL)} bytes; at most {MAX_TOTAL_BYTES}"]


def test_an_uploads_wrapping_folder_does_not_count_against_the_path_limits():
    deepest = "a/b/c/d/e/f/g/h.md"  # MAX_DEPTH levels below the wrapping folder
    longest = "r/" + "x" * (MAX_PATH_CHARS - 5) + ".md"  # MAX_PATH_CHARS characters below it
    package = package_from_upload([("demo-skill/SKILL.md", SKILL), (f"demo-skill/{deepest}", b"d"),
                                   (f"demo-skill/{longest}", b"l")])
    assert sorted(package.files) == sorted(["SKILL.md", deepest, longest])


def test_an_uploads_refused_skill_md_is_not_also_reported_missing():
    assert upload_refused([("SKILL.md", "text")]) == ['file "SKILL.md" is not bytes']


def test_an_uploads_wrapping_folder_must_match_the_skill():
    assert upload_refused([("my-skill/SKILL.md", SKILL)]) == ['name "demo-skill" must equal the folder name "my-skill"']


def test_members_that_do_not_hold_what_they_declare_are_each_listed(monkeypatch):
    data = make_zip([("SKILL.md", SKILL), ("a.md", b"0123456789"), ("b.md", b"0123456789")])
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, info, *a, **k: (
        io.BytesIO(b"short") if info.filename != "SKILL.md" else real_open(self, info)))
    assert refused(data) == ['entry "a.md" holds 5 bytes, not the 10 it declares',
                             'entry "b.md" holds 5 bytes, not the 10 it declares']


class CorruptStream(EndlessStream):
    def read(self, size=-1):
        raise zipfile.BadZipFile("bad data")


def test_corrupt_members_are_each_listed(monkeypatch):
    data = make_zip([("SKILL.md", SKILL), ("a.md", b"0123456789"), ("b.md", b"0123456789")])
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, info, *a, **k: (
        CorruptStream() if info.filename != "SKILL.md" else real_open(self, info)))
    assert refused(data) == ['entry "a.md" is corrupt: bad data', 'entry "b.md" is corrupt: bad data']


@pytest.mark.parametrize("spare", [0, 1], ids=["a chunk past the total", "the total to the byte"])
def test_inflating_past_the_total_stops_the_reading_at_once(monkeypatch, spare):
    """What was read so far counts against the total: SKILL.md and b.md are read, then a.md (and c.md after
    it) inflate by a whole chunk. With less than a chunk left that is past the total, and the reading stops
    there; with exactly a chunk left it is not, and each is refused for inflating past what it declared."""
    limit = len(SKILL) + 10 + archives.CHUNK_BYTES - 1 + spare
    monkeypatch.setattr(archives, "MAX_TOTAL_BYTES", limit)  # a.md and b.md declare 10 bytes each: within it
    data = make_zip([("SKILL.md", SKILL), ("b.md", b"0123456789"), ("a.md", b"0123456789"), ("c.md", b"0")])
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, info, *a, **k: (
        EndlessStream() if info.filename in ("a.md", "c.md") else real_open(self, info)))
    expected = (['entry "a.md" inflates beyond its declared 10 bytes (a zip bomb?)',
                 'entry "c.md" inflates beyond its declared 1 bytes (a zip bomb?)'] if spare
                else [f"the files inflate to more than {limit} bytes"])
    assert refused(data) == expected


def test_the_ratio_is_checked_again_on_what_was_read(monkeypatch):
    """Incompressible data hides a bomb's ratio in the declared sizes; if it then fails to read, what is left
    is judged on its own."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("SKILL.md", SKILL)
        archive.writestr("noise.bin", os.urandom(100_000))
        zeros_member(archive, "a.bin", 900 * 1024)
        zeros_member(archive, "b.bin", 900 * 1024)
    data = buffer.getvalue()
    infos = {info.filename: info for info in zipfile.ZipFile(io.BytesIO(data)).infolist()}
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, info, *a, **k: (
        CorruptStream() if info.filename == "noise.bin" else real_open(self, info)))
    compressed = sum(infos[name].compress_size for name in ("SKILL.md", "a.bin", "b.bin"))
    assert refused(data) == ['entry "noise.bin" is corrupt: bad data',
                             f"the archive inflates {compressed} bytes to {1800 * 1024 + len(SKILL)} "
                             "(more than 100 times): it looks like a zip bomb"]


def test_a_member_larger_than_a_chunk_is_read_whole():
    content = os.urandom(3 * archives.CHUNK_BYTES + 5)
    assert package_from_zip(make_zip([("SKILL.md", SKILL), ("big.bin", content)])).files["big.bin"] == content


def test_a_utf8_flagged_name_is_taken_as_it_is():
    """Only names without the UTF-8 flag are guessed at: this one's characters, read as cp437 bytes, would
    make other valid UTF-8 ("é")."""
    name = "notes/\u251c\u2310.md"
    assert sorted(package_from_zip(make_zip([("SKILL.md", SKILL), (name, b"x")])).files) == ["SKILL.md", name]


def test_a_cp437_name_that_is_not_utf8_is_read_as_cp437():
    data = make_zip([("SKILL.md", SKILL), ("notes/cafXY.md", b"menu")]).replace(b"cafXY", b"caf\x82s")
    assert sorted(package_from_zip(data).files) == ["SKILL.md", "notes/caf\u00e9s.md"]


def test_the_ratio_limit_applies_past_its_floor_and_over_its_ratio_only():
    floor, ratio = archives.RATIO_FLOOR_BYTES, archives.MAX_RATIO
    assert archives._ratio_problem(floor, 1) is None  # not past the floor, however compressed
    assert archives._ratio_problem(ratio * 20_000, 20_000) is None  # exactly the ratio
    assert archives._ratio_problem(ratio * 20_000 + 1, 20_000) is not None
    assert archives._ratio_problem(2 * floor, floor) is None  # past the floor, barely compressed
    assert archives._ratio_problem(floor + 1, 0) is not None


def test_an_archives_wrapping_folder_does_not_count_against_the_path_limits():
    deepest = "a/b/c/d/e/f/g/h.md"
    longest = "r/" + "x" * (MAX_PATH_CHARS - 5) + ".md"
    package = package_from_zip(make_zip([("demo-skill/SKILL.md", SKILL), (f"demo-skill/{deepest}", b"d"),
                                         (f"demo-skill/{longest}", b"l")]))
    assert sorted(package.files) == sorted(["SKILL.md", deepest, longest])


def test_folder_entries_are_known_by_their_slash_or_their_mode_and_the_root_is_skipped():
    by_slash = entry("references/")  # no Unix mode, as DOS tools write it
    by_mode = entry("docs", mode=stat.S_IFDIR | 0o755)  # no slash
    data = make_zip([("./", b""), ("SKILL.md", SKILL), (by_slash, b""), ("references/a.md", b"A"), (by_mode, b"")])
    assert package_from_zip(data).files == {"SKILL.md": SKILL, "references/a.md": b"A"}


def test_an_uploads_total_counts_the_files_it_skips_too():
    files = [("SKILL.md", SKILL), *[(f"{i}.bin", bytes(MAX_FILE_BYTES)) for i in range(7)],
             ("__MACOSX/._0.bin", bytes(MAX_FILE_BYTES))]
    assert upload_refused(files) == [
        f"the files add up to {8 * MAX_FILE_BYTES + len(SKILL)} bytes; at most {MAX_TOTAL_BYTES}"]


def test_every_special_entry_is_listed_and_a_special_skill_md_is_not_also_missing():
    link = stat.S_IFLNK | 0o777
    assert refused(make_zip([(entry("a-link", mode=link), b"/etc/passwd"), (entry("SKILL.md", mode=link), b"x")])) == [
        'entry "a-link" is a symbolic link; only regular files and folders are allowed',
        'entry "SKILL.md" is a symbolic link; only regular files and folders are allowed']


# --- each refusal, each bound, and reading on past each bad entry ------------------------------------------

LINK = 'entry "z-link" is a symbolic link; only regular files and folders are allowed'
LINKED = (entry("z-link", mode=stat.S_IFLNK | 0o777), b"/etc/passwd")  # a second bad entry, listed last


@pytest.mark.parametrize("data", ["SKILL.md", None, [b"PK"]])
def test_what_is_no_file_is_refused(data):
    assert refused(data) == ["the upload is not a file"]


def test_an_archive_of_the_largest_size_is_read():
    assert refused(b"\0" * MAX_ARCHIVE_BYTES) == ["the upload is not a zip archive"]


def test_the_largest_count_of_entries_and_files_is_taken():
    entries = make_zip([("SKILL.md", SKILL), *[(f"d{i}/", b"") for i in range(MAX_ENTRIES - 1)]])
    assert package_from_zip(entries).name == "demo-skill"
    files = make_zip([("SKILL.md", SKILL), *[(f"r/{i}.md", b"") for i in range(MAX_FILES - 1)]])
    assert len(package_from_zip(files).files) == MAX_FILES


def test_files_of_the_largest_total_are_judged_by_their_ratio_not_their_total():
    sizes = {f"part{i}.bin": MAX_FILE_BYTES for i in range(MAX_TOTAL_BYTES // MAX_FILE_BYTES - 1)}
    sizes["last.bin"] = MAX_FILE_BYTES - len(SKILL)
    (problem,) = refused(zip_of_zeros(sizes))
    assert problem.startswith("the archive inflates ") and f"to {MAX_TOTAL_BYTES} (more than 100 times)" in problem


def test_reading_goes_on_past_each_kind_of_bad_entry():
    encrypted = patch_central(make_zip([("SKILL.md", SKILL), ("secret.md", b"x"), LINKED]), b"secret.md", 8, "<H", 1)
    assert refused(encrypted) == ['entry "secret.md" is encrypted; upload the archive without a password', LINK]
    compressed = make_zip([("SKILL.md", SKILL), (entry("a.md", compression=zipfile.ZIP_BZIP2), b"x"), LINKED])
    assert refused(compressed) == [
        'entry "a.md" uses compression method 12; only stored and deflate are accepted', LINK]
    twice = make_zip([("SKILL.md", SKILL), ("a.md", b"x"), ("a.md", b"y"), LINKED])
    assert refused(twice) == ['path "a.md" appears more than once', LINK]
    large = patch_central(make_zip([("SKILL.md", SKILL), ("big.md", b"x"), LINKED]), b"big.md", 24, "<L",
                          MAX_FILE_BYTES + 1)
    assert refused(large) == [f'file "big.md" is {MAX_FILE_BYTES + 1} bytes; at most {MAX_FILE_BYTES}', LINK]
    ignored = make_zip([("./", b""), ("__MACOSX/._SKILL.md", b"fork"), ("SKILL.md", SKILL)])
    assert package_from_zip(ignored).files == {"SKILL.md": SKILL}


def test_a_refused_skill_md_is_only_reported_for_what_is_wrong_with_it():
    bzip = make_zip([(entry("SKILL.md", compression=zipfile.ZIP_BZIP2), SKILL)])
    assert refused(bzip) == ['entry "SKILL.md" uses compression method 12; only stored and deflate are accepted']
    large = patch_central(make_zip([("SKILL.md", SKILL)]), b"SKILL.md", 24, "<L", MAX_FILE_BYTES + 1)
    assert refused(large) == [f'file "SKILL.md" is {MAX_FILE_BYTES + 1} bytes; at most {MAX_FILE_BYTES}']


# --- the end record, read before zipfile parses the directory ------------------------------------------

END = struct.Struct("<4s4H2LH")  # the end of central directory record (22 bytes)
MISSING = ("SKILL.md is missing: put it at the top of the archive, or in a single folder that holds everything")


def test_an_empty_archive_is_read_from_its_end_record_at_the_start():
    assert make_zip([]) == END.pack(b"PK\x05\x06", 0, 0, 0, 0, 0, 0, 0)
    assert refused(make_zip([])) == [MISSING]


def test_the_end_record_is_looked_for_only_where_a_comment_can_reach():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("SKILL.md", SKILL)
        archive.comment = b"c" * 0xFFFF  # the longest comment: the record starts 65,557 bytes from the end
    assert package_from_zip(buffer.getvalue()).name == "demo-skill"
    beyond = END.pack(b"PK\x05\x06", 0, 0, 0, 0, 0, 0, 0) + bytes(70_000)  # too far from the end to be one
    assert refused(beyond) == ["the upload is not a zip archive"]


def test_the_last_end_record_is_the_one_read():
    fake = END.pack(b"PK\x05\x06", 1, 0, 0, 0, 0, 0, 0)  # a record of a second disk, inside a stored file
    data = make_zip([("SKILL.md", SKILL), ("fake.bin", fake)], compression=zipfile.ZIP_STORED)
    assert package_from_zip(data).files["fake.bin"] == fake


def test_an_archive_over_several_disks_is_refused():
    data = bytearray(make_zip([("SKILL.md", SKILL)]))
    struct.pack_into("<H", data, data.rfind(b"PK\x05\x06") + 4, 1)
    assert refused(bytes(data)) == ["the archive spans several disks; upload a single zip file"]


def test_a_zip64_locator_without_its_record_is_refused(monkeypatch):
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, 0, 1)
    for before in (b"", b"x" * 56):  # nothing before the locator, or what is no ZIP64 end record
        assert refused(before + locator + END.pack(b"PK\x05\x06", 0, 0, 0, 0, 0, 0, 0)) == [
            "the archive is corrupt: its ZIP64 end record is missing"]
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", -1)  # ZIP64 end records even for no entries
    empty64 = make_zip([])
    monkeypatch.undo()
    assert empty64.startswith(b"PK\x06\x06")  # the record at the very start
    assert refused(empty64) == [MISSING]


def test_a_directory_of_the_largest_size_passes_the_end_records_check():
    data = bytearray(make_zip([("SKILL.md", SKILL)]))
    struct.pack_into("<L", data, data.rfind(b"PK\x05\x06") + 12, MAX_CENTRAL_DIRECTORY_BYTES)
    (problem,) = refused(bytes(data))
    assert problem.startswith("the archive is corrupt: ")  # zipfile's own finding, not the size bound's


def test_a_missing_skill_md_names_at_most_five_found_elsewhere():
    nested = [f"f{i}/SKILL.md" for i in range(6)]
    assert refused(make_zip([(name, SKILL) for name in nested])) == [
        MISSING + ' (found "f0/SKILL.md", "f1/SKILL.md", "f2/SKILL.md", "f3/SKILL.md", "f4/SKILL.md")']
