"""Skill uploads: a zip archive, or a set of files with relative paths (a browser's folder upload).

Uploads are hostile until proven otherwise. Both functions are pure: they return a validated SkillPackage
or raise PackageProblems listing what is wrong; nothing is written anywhere, so nothing is half-stored.

Refused, each with its own message: what is not a zip or is a corrupt one; traversal (`..`, absolute
paths, drive letters, backslashes, percent-encoded and Unicode look-alike dots and slashes, NUL and
control characters: the path rules of `skills.packages`); symlinks, devices, FIFOs and sockets (the
Unix file type in an entry's external attributes); encrypted entries; compression methods other than
stored and deflate; duplicate paths (also ignoring case, and after normalisation); too many entries
(counted from the end-of-central-directory record before the directory itself is parsed); too large
files or totals (declared sizes are checked before anything is read, then every entry is read in chunks
under a hard cap, declared sizes never trusted); a compression ratio over MAX_RATIO. Directories carry
no data; `__MACOSX/` (macOS resource forks) is skipped; archives inside the archive are plain files.

Layout: `SKILL.md` at the root, or a single top-level folder wrapping everything (`my-skill/SKILL.md`:
the folder is `my-skill`, paths are relative to it). Without a wrapping folder the folder name is the
`folder` argument, if any, else the front matter's name.
"""
import contextlib
import io
import stat
import struct
import zipfile
import zlib
from collections.abc import Iterable

from skills.packages import (
    MAX_DEPTH,
    MAX_ENTRIES,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_PATH_CHARS,
    MAX_TOTAL_BYTES,
    SKILL_FILE,
    PackageProblems,
    SkillPackage,
    SkillPathRefused,
    normalised_path,
    package_from_files,
    show,
)

MAX_ARCHIVE_BYTES = MAX_TOTAL_BYTES + 2 * 1024 * 1024  # the upload itself: stored files plus headers
MAX_CENTRAL_DIRECTORY_BYTES = 1024 * 1024  # read by zipfile in one go when the archive is opened
MAX_RATIO = 100  # inflated / compressed, over the whole archive …
RATIO_FLOOR_BYTES = 1024 * 1024  # … once it inflates to more than this
CHUNK_BYTES = 64 * 1024
IGNORED_TOP_FOLDERS = ("__MACOSX",)  # resource forks macOS adds to the archives it makes
# A wrapping folder's name adds one level and up to a skill name's length; the package checks the rest.
_RAW_MAX_DEPTH = MAX_DEPTH + 1
_RAW_MAX_CHARS = MAX_PATH_CHARS + 65

_ENCRYPTED = 0x1
_STRONG_ENCRYPTION = 0x40
_UTF8_NAMES = 0x800
_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}
_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFSOCK: "a socket"}

_EOCD = struct.Struct("<4s4H2LH")  # end of central directory record
_EOCD64_LOCATOR = struct.Struct("<4sLQL")
_EOCD64 = struct.Struct("<4sQ2H2L4Q")


def package_from_zip(data: bytes, *, folder: str | None = None) -> SkillPackage:
    """A validated package from a zip archive's bytes, or PackageProblems."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise PackageProblems(["the upload is not a file"])
    data = bytes(data)
    if not data:
        raise PackageProblems(["the upload is empty"])
    if len(data) > MAX_ARCHIVE_BYTES:
        raise PackageProblems([f"the archive is {len(data)} bytes; at most {MAX_ARCHIVE_BYTES}"])
    _check_directory_record(data)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, ValueError, EOFError, OSError,
            UnicodeDecodeError, struct.error) as exc:
        raise PackageProblems([f"the archive is corrupt: {exc}"]) from None
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_ENTRIES:
            raise PackageProblems([f"the archive has {len(infos)} entries; at most {MAX_ENTRIES}"])
        members, refused, problems = _members(infos)
        root, wrapper = _layout([path for path, _ in members], folder, problems, refused)
        files = _read(archive, members, wrapper, problems)
    return _package(files, root, problems)


def package_from_upload(files: Iterable[tuple[str, bytes]], *, folder: str | None = None) -> SkillPackage:
    """A validated package from uploaded files, each (relative path, content), or PackageProblems.
    A browser's folder upload names them `my-skill/SKILL.md`, …: the wrapping folder is the skill's.
    `folder` as for package_from_zip."""
    entries = list(files)
    if not entries:
        raise PackageProblems(["the upload has no files"])
    if len(entries) > MAX_FILES:
        raise PackageProblems([f"the upload has {len(entries)} files; at most {MAX_FILES}"])
    problems: list[str] = []
    accepted: list[tuple[str, bytes]] = []
    refused: set[str] = set()
    seen: dict[str, str] = {}
    total = 0
    for entry in entries:
        if not (isinstance(entry, tuple | list) and len(entry) == 2):
            problems.append("each uploaded file must be a (path, content) pair")
            continue
        raw, content = entry
        try:
            path = normalised_path(raw, max_chars=_RAW_MAX_CHARS, max_depth=_RAW_MAX_DEPTH)
        except SkillPathRefused as exc:
            problems.append(str(exc))
            continue
        if not isinstance(content, bytes | bytearray | memoryview):
            problems.append(f"file {show(path)} is not bytes")
            refused.add(path)
            continue
        if problem := _duplicate(seen, path, raw):
            problems.append(problem)
            continue
        if len(content) > MAX_FILE_BYTES:
            problems.append(f"file {show(path)} is {len(content)} bytes; at most {MAX_FILE_BYTES}")
            refused.add(path)
            continue
        total += len(content)
        if path.split("/", 1)[0] not in IGNORED_TOP_FOLDERS:
            accepted.append((path, bytes(content)))
    if total > MAX_TOTAL_BYTES:
        raise PackageProblems([*problems, f"the files add up to {total} bytes; at most {MAX_TOTAL_BYTES}"])
    root, wrapper = _layout([path for path, _ in accepted], folder, problems, refused)
    files = {_unwrap(path, wrapper): content for path, content in accepted}
    return _package(files, root, problems)


def _package(files: dict[str, bytes], folder: str | None, problems: list[str]) -> SkillPackage:
    """The package of the acceptable files, or PackageProblems with the upload's problems (entries left
    out) followed by the package's own (its front matter …): every problem in one answer."""
    if SKILL_FILE not in files:  # it could not be read: its problem is listed
        raise PackageProblems(problems)
    try:
        package = package_from_files(files, folder=folder)
    except PackageProblems as exc:
        problems = [*problems, *exc.problems]
    if problems:
        raise PackageProblems(problems)
    return package


# --- the archive's structure -------------------------------------------------------------------------

def _check_directory_record(data: bytes) -> None:
    """Count the entries and size the central directory from the end record, before zipfile parses the
    directory (one object per entry): an archive of a million tiny entries is refused unread."""
    start = data.rfind(b"PK\x05\x06", max(0, len(data) - (1 << 16) - _EOCD.size))
    if start < 0 or len(data) - start < _EOCD.size:
        raise PackageProblems(["the upload is not a zip archive"])
    _, disk, _, _, entries, directory_bytes, _, _ = _EOCD.unpack_from(data, start)
    locator = start - _EOCD64_LOCATOR.size
    if locator >= 0 and data[locator:locator + 4] == b"PK\x06\x07":
        record = locator - _EOCD64.size
        if record < 0 or data[record:record + 4] != b"PK\x06\x06":
            raise PackageProblems(["the archive is corrupt: its ZIP64 end record is missing"])
        _, _, _, _, disk, _, _, entries, directory_bytes, _ = _EOCD64.unpack_from(data, record)
    if disk != 0:
        raise PackageProblems(["the archive spans several disks; upload a single zip file"])
    if entries > MAX_ENTRIES:
        raise PackageProblems([f"the archive has {entries} entries; at most {MAX_ENTRIES}"])
    if directory_bytes > MAX_CENTRAL_DIRECTORY_BYTES:
        raise PackageProblems([f"the archive's directory is {directory_bytes} bytes; "
                               f"at most {MAX_CENTRAL_DIRECTORY_BYTES}"])


def _entry_name(info: zipfile.ZipInfo) -> str:
    """The entry's name as stored (zipfile cuts it at a NUL; the original keeps it). Names without the
    UTF-8 flag are read as UTF-8 when they are valid UTF-8 (what macOS and most tools write), else cp437."""
    name = info.orig_filename
    if not info.flag_bits & _UTF8_NAMES and not name.isascii():
        with contextlib.suppress(UnicodeError):
            name = name.encode("cp437").decode("utf-8")
    return name


def _duplicate(seen: dict[str, str], path: str, raw: str) -> str | None:
    key = path.casefold()
    if key not in seen:
        seen[key] = path
        return None
    if seen[key] == path:
        return f"path {show(raw)} appears more than once"
    return f"path {show(raw)} clashes with {show(seen[key])} (they differ only in case)"


def _members(infos: list[zipfile.ZipInfo]) -> tuple[list[tuple[str, zipfile.ZipInfo]], set[str], list[str]]:
    """The file entries worth reading, each under its checked path; the paths of the entries refused; and
    their problems. Too many files, or declared sizes over the limits, raise PackageProblems at once:
    nothing is read."""
    problems: list[str] = []
    refused: set[str] = set()
    members: list[tuple[str, zipfile.ZipInfo]] = []
    seen: dict[str, str] = {}
    declared = compressed = 0
    for info in infos:
        raw = _entry_name(info)
        kind = stat.S_IFMT(info.external_attr >> 16)
        directory = raw.endswith("/") or kind == stat.S_IFDIR
        try:
            path = normalised_path(raw.removesuffix("/") if directory else raw,
                                   max_chars=_RAW_MAX_CHARS, max_depth=_RAW_MAX_DEPTH)
        except SkillPathRefused as exc:
            if directory and raw == "./":
                continue  # the archive's own root
            problems.append(str(exc))
            continue
        if kind in _KINDS:
            problems.append(f"entry {show(path)} is {_KINDS[kind]}; only regular files and folders are allowed")
            refused.add(path)
            continue
        if info.flag_bits & (_ENCRYPTED | _STRONG_ENCRYPTION):
            problems.append(f"entry {show(path)} is encrypted; upload the archive without a password")
            refused.add(path)
            continue
        if directory:
            if info.file_size:
                problems.append(f"folder entry {show(path)} carries data")
            continue
        if path.split("/", 1)[0] in IGNORED_TOP_FOLDERS:
            continue
        if info.compress_type not in _METHODS:
            problems.append(f"entry {show(path)} uses compression method {info.compress_type}; "
                            "only stored and deflate are accepted")
            refused.add(path)
            continue
        if problem := _duplicate(seen, path, raw):
            problems.append(problem)
            continue
        if info.file_size > MAX_FILE_BYTES:
            problems.append(f"file {show(path)} is {info.file_size} bytes; at most {MAX_FILE_BYTES}")
            refused.add(path)
            continue
        declared += info.file_size
        compressed += info.compress_size
        members.append((path, info))
    fatal = []
    if len(members) > MAX_FILES:
        fatal.append(f"the archive has {len(members)} files; at most {MAX_FILES}")
    if declared > MAX_TOTAL_BYTES:
        fatal.append(f"the files add up to {declared} bytes; at most {MAX_TOTAL_BYTES}")
    elif (ratio := _ratio_problem(declared, compressed)) is not None:
        fatal.append(ratio)
    if fatal:
        raise PackageProblems([*problems, *fatal])
    return members, refused, problems


def _ratio_problem(inflated: int, compressed: int) -> str | None:
    if inflated > RATIO_FLOOR_BYTES and inflated > MAX_RATIO * max(compressed, 1):
        return (f"the archive inflates {compressed} bytes to {inflated} "
                f"(more than {MAX_RATIO} times): it looks like a zip bomb")
    return None


def _layout(paths: list[str], folder: str | None, problems: list[str],
            refused: set[str] = frozenset()) -> tuple[str | None, str | None]:
    """(the folder name the skill's name must equal, the wrapping folder to strip); PackageProblems, after
    the `problems` found so far, when SKILL.md is refused (its problem is listed) or nowhere to be found.
    `refused`: the paths of entries refused, which count for the layout but are not there."""
    everything = [*paths, *refused]
    if SKILL_FILE in everything:
        if SKILL_FILE in refused:
            raise PackageProblems(problems)
        return folder, None
    tops = {path.split("/", 1)[0] for path in everything}
    if len(tops) == 1 and all("/" in path for path in everything):
        (wrapper,) = tops
        if f"{wrapper}/{SKILL_FILE}" in refused:
            raise PackageProblems(problems)
        if f"{wrapper}/{SKILL_FILE}" in paths:
            if folder is not None and folder != wrapper:
                raise PackageProblems([*problems, f"the archive's folder {show(wrapper)} must be named "
                                                  f"{show(folder)}, like the skill"])
            return wrapper, wrapper
    nested = sorted(path for path in paths if path.rsplit("/", 1)[-1] == SKILL_FILE)
    found = f" (found {', '.join(show(p) for p in nested[:5])})" if nested else ""
    raise PackageProblems([*problems, f"{SKILL_FILE} is missing: put it at the top of the archive, or in a "
                                      f"single folder that holds everything{found}"])


def _unwrap(path: str, wrapper: str | None) -> str:
    return path if wrapper is None else path[len(wrapper) + 1:]


def _read(archive: zipfile.ZipFile, members: list[tuple[str, zipfile.ZipInfo]], wrapper: str | None,
          problems: list[str]) -> dict[str, bytes]:
    """Every member's content, read in chunks under hard caps: at most its declared size (itself within
    MAX_FILE_BYTES) and MAX_TOTAL_BYTES in all, whatever the archive claims. Problems are added to
    `problems`; PackageProblems at once when the whole is too large or inflates too much."""
    files: dict[str, bytes] = {}
    total = compressed = 0
    for path, info in members:
        try:
            content = _read_member(archive, info, path, budget=MAX_TOTAL_BYTES - total)
        except _Refused as exc:
            if exc.fatal:
                raise PackageProblems([*problems, str(exc)]) from None
            problems.append(str(exc))
            continue
        except (zipfile.BadZipFile, EOFError, zlib.error, OSError, ValueError, RuntimeError, NotImplementedError,
                struct.error) as exc:
            problems.append(f"entry {show(path)} is corrupt: {exc}")
            continue
        total += len(content)
        compressed += info.compress_size
        files[_unwrap(path, wrapper)] = content
    if (ratio := _ratio_problem(total, compressed)) is not None:
        raise PackageProblems([*problems, ratio])
    return files


class _Refused(Exception):  # noqa: N818
    def __init__(self, message: str, *, fatal: bool = False):
        super().__init__(message)
        self.fatal = fatal


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: str, *, budget: int) -> bytes:
    cap = min(info.file_size, MAX_FILE_BYTES)
    chunks: list[bytes] = []
    size = 0
    with archive.open(info) as stream:
        while chunk := stream.read(CHUNK_BYTES):
            size += len(chunk)
            if size > budget:
                raise _Refused(f"the files inflate to more than {MAX_TOTAL_BYTES} bytes", fatal=True)
            if size > cap:
                raise _Refused(f"entry {show(path)} inflates beyond its declared {info.file_size} bytes "
                               "(a zip bomb?)")
            chunks.append(chunk)
    if size != info.file_size:
        raise _Refused(f"entry {show(path)} holds {size} bytes, not the {info.file_size} it declares")
    return b"".join(chunks)
