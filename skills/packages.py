"""Skill packages in the Agent Skills format: validation, paths, platform folders (pure: no models, no database).

A skill is a folder: `SKILL.md` (YAML front matter between `---` lines, then a Markdown body) and resource
files read by relative path. `package_from_files` checks a set of files by the Agent Skills rules (the
reference validator's, ../shared/MCP-NOTES.md) and by this platform's limits, and reports every problem at
once (`PackageProblems.problems`). `package_from_folder` reads a platform skill from disk; uploads come in
through `skills.archives`. `skill_path` is the path rule of `load_skill_through_path`
(docs/notes/knowledge-and-skills.md).

Paths inside a package are relative POSIX paths, NFC-normalised. Refused everywhere: empty paths, NUL and
control characters, invisible formatting characters (bidi overrides, zero-width), percent-encoding (`%2e`),
backslashes in stored paths, `:` (drive letters, alternate streams), absolute paths, `..`, segments made of
dots or ending in a dot or space, and characters that look like or normalise (NFKC) to `.`, `/`, `\\`, `:`
or `%` (U+2024 ONE DOT LEADER, U+FF0E FULLWIDTH FULL STOP, U+2215 DIVISION SLASH, U+FF0F …).
"""
import hashlib
import os
import re
import stat
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from common.documents import DocumentRefused, yaml_parse

# --- limits ----------------------------------------------------------------------------------------
MAX_FILES = 200  # files in a package, SKILL.md included
MAX_ENTRIES = 500  # entries of an archive or a folder, directories included, counted before anything is read
MAX_FILE_BYTES = 1024 * 1024  # one file
MAX_TOTAL_BYTES = 8 * 1024 * 1024  # all files together
MAX_PATH_CHARS = 255  # a file's relative path
MAX_DEPTH = 8  # segments of a relative path (`a/b/c.md` is 3)
MAX_FRONT_MATTER_BYTES = 16 * 1024  # the YAML between the `---` lines
MAX_FRONT_MATTER_NESTING = 8  # collections inside collections in the front matter
MAX_FRONT_MATTER_VALUES = 1000  # scalars, keys, lists and mappings (64 metadata entries are 130)

# --- the Agent Skills rules ------------------------------------------------------------------------
SKILL_FILE = "SKILL.md"
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
MAX_COMPATIBILITY_CHARS = 500
MAX_LICENSE_CHARS = 500  # not in the spec: a license is a name or a pointer to a bundled file
MAX_METADATA_ENTRIES = 64
MAX_METADATA_CHARS = 1024  # a metadata key or value
ALLOWED_FIELDS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")
NAME_CHARS = re.compile(r"[a-z0-9-]+")

PLATFORM_DIR = Path(__file__).resolve().parent  # platform skills: skills/<name>/SKILL.md

_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_DRIVE = re.compile(r"[A-Za-z]:")
_PATH_SIGNIFICANT = frozenset("./\\:%")
# Characters that look like a dot, slash or backslash but that NFKC leaves alone (so the check by
# normalisation misses them). Those NFKC maps onto one (U+2024, U+FF0E, U+FF0F, U+FE68 …) are caught there.
_LOOKALIKES = {
    "\u0337": "/", "\u0338": "/", "\u2044": "/", "\u2215": "/", "\u2571": "/", "\u27cb": "/", "\u29f8": "/",
    "\u3033": "/", "\u2216": "\\", "\u2572": "\\", "\u27cd": "\\", "\u29f5": "\\", "\u29f9": "\\",
    "\u0701": ".", "\u0702": ".", "\ua4f8": ".", "\u2e31": ".",
}


class PackageProblems(Exception):  # noqa: N818 (the name says what it carries)
    """A skill package was refused; `problems` lists every problem found, each a complete sentence."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        count = len(self.problems)
        super().__init__(f"the skill package has {count} problem{'s' if count != 1 else ''}: "
                         + "; ".join(self.problems))


class SkillPathError(ValueError):
    """A path asked of a skill cannot be served; the message says why."""


class SkillPathRefused(SkillPathError):
    """The path is not acceptable at all (traversal, absolute, `.`, a directory, a hidden file …)."""


class SkillPathMissing(SkillPathError):
    """The path is well-formed but names no file of the skill; `available` lists those that exist."""

    def __init__(self, path: str, available: list[str]):
        self.path = path
        self.available = list(available)
        super().__init__(f"no file {show(path)} in this skill; available: {', '.join(self.available)}")


@dataclass(frozen=True)
class SkillPackage:
    """A validated skill. Treat `front_matter` and `files` as read-only."""

    name: str
    description: str
    front_matter: dict  # the known fields present: name, description, license, compatibility, metadata, allowed-tools
    body: str  # SKILL.md after the front matter
    files: dict[str, bytes] = field(repr=False)  # relative POSIX path -> content, SKILL.md included

    def __hash__(self) -> int:
        return hash(self.digest())

    @property
    def allowed_tools(self) -> list[str]:
        """`allowed-tools` as a list of tool names (a hint for operators; it never grants anything)."""
        return allowed_tools_list(self.front_matter.get("allowed-tools"))

    def resource_paths(self) -> list[str]:
        """The files that may be loaded besides SKILL.md, sorted; hidden ones (a `.` segment) left out."""
        return resource_paths(self.files)

    def available_paths(self) -> list[str]:
        """What `skill_path` serves: SKILL.md first, then the resources."""
        return [SKILL_FILE, *self.resource_paths()]

    def digest(self) -> str:
        """sha256 (hex) over every path and content in path order: equal packages, equal digests."""
        return files_digest(self.files)


# --- paths ---------------------------------------------------------------------------------------

def show(text: str, limit: int = 80) -> str:
    """A hostile string, quoted for a message: control, invisible and separator characters escaped."""
    shown = "".join(
        ch if ch == " " or unicodedata.category(ch)[0] not in "CZ" else f"\\u{ord(ch):04x}"
        for ch in str(text)[:limit])
    return f'"{shown}{"…" if len(str(text)) > limit else ""}"'


def _char_name(ch: str) -> str:
    fallback = "<control>" if unicodedata.category(ch) == "Cc" else "<unnamed>"
    return f"U+{ord(ch):04X} {unicodedata.name(ch, fallback)}"


def _characters_problem(path: str) -> str | None:
    """What is wrong with a path's characters, whatever its use (stored or asked for)."""
    for ch in path:
        if ch == "\x00":
            return f"path {show(path)} contains a NUL character"
        category = unicodedata.category(ch)
        if category == "Cc":
            return f"path {show(path)} contains a control character ({_char_name(ch)})"
        if category in ("Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            return f"path {show(path)} contains an invisible or unassigned character ({_char_name(ch)})"
    if match := _PERCENT_ESCAPE.search(path):
        return f"path {show(path)} contains percent-encoding ({match.group()}); send the plain path"
    for ch in path:
        folded = unicodedata.normalize("NFKC", ch)
        looks_like = _LOOKALIKES.get(ch) or (
            folded != ch and next((c for c in folded if c in _PATH_SIGNIFICANT), None))
        if looks_like:
            return (f"path {show(path)} contains {_char_name(ch)}, which looks like {looks_like!r}; "
                    "use plain characters")
    if _DRIVE.match(path):
        return f"path {show(path)} starts with a drive letter ({path[:2]})"
    if ":" in path:
        return f"path {show(path)} contains ':'"
    return None


def _segment_problem(path: str, segment: str) -> str | None:
    if segment == "..":
        return f"path {show(path)} leaves the skill folder ('..')"
    if set(segment) <= {".", " "}:
        return f"path {show(path)} has a segment made only of dots and spaces ({show(segment)})"
    if segment != segment.strip():
        return f"path {show(path)} has a segment that starts or ends with whitespace ({show(segment)})"
    if segment.endswith("."):
        return f"path {show(path)} has a segment ending in a dot ({show(segment)})"
    return None


def _length_problem(path: str, parts: list[str], *, max_chars: int, max_depth: int) -> str | None:
    if len(path) > max_chars:
        return f"path {show(path)} is {len(path)} characters long; at most {max_chars}"
    if len(parts) > max_depth:
        return f"path {show(path)} is {len(parts)} levels deep; at most {max_depth}"
    return None


def normalised_path(raw: str, *, max_chars: int = MAX_PATH_CHARS, max_depth: int = MAX_DEPTH) -> str:
    """A stored file's path, checked and normalised (NFC; `.` and empty segments dropped), or
    SkillPathRefused saying why not. Backslashes are refused here: a file name never holds one."""
    if not isinstance(raw, str):
        raise SkillPathRefused(f"path {raw!r} is not text")
    if not raw:
        raise SkillPathRefused("a path is empty")
    if len(raw) > 4 * max_chars:
        raise SkillPathRefused(f"path {show(raw)} is {len(raw)} characters long; at most {max_chars}")
    if problem := _characters_problem(raw):
        raise SkillPathRefused(problem)
    if "\\" in raw:
        raise SkillPathRefused(f"path {show(raw)} contains a backslash; use '/' between folders")
    if raw.startswith("/"):
        raise SkillPathRefused(f"path {show(raw)} is absolute (it starts with '/')")
    if raw.endswith("/"):
        raise SkillPathRefused(f"path {show(raw)} ends with '/': it names a folder, not a file")
    path = unicodedata.normalize("NFC", raw)
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts:
        raise SkillPathRefused(f"path {show(raw)} names no file")
    for part in parts:
        if problem := _segment_problem(raw, part):
            raise SkillPathRefused(problem)
    path = "/".join(parts)
    if problem := _length_problem(path, parts, max_chars=max_chars, max_depth=max_depth):
        raise SkillPathRefused(problem)
    return path


def is_hidden(path: str) -> bool:
    """A path with a dot-prefixed segment (`.env`, `.git/config`): stored, never served."""
    return any(part.startswith(".") for part in path.split("/"))


def resource_paths(paths: Iterable[str]) -> list[str]:
    return sorted(p for p in paths if p != SKILL_FILE and not is_hidden(p))


def skill_path(package_or_paths: "SkillPackage | Iterable[str]", requested: str) -> str:
    """The path of `load_skill_through_path`: which of the skill's files `requested` names.

    Backslashes become `/`. Refused (SkillPathRefused): empty, a leading `/`, `..`, `.` or `./` (any `.`
    or empty segment), drive letters, percent-encoding, NUL and control characters, look-alikes of `.`
    and `/`, a directory, a hidden (dot-prefixed) segment. A well-formed path that names no file raises
    SkillPathMissing listing the available paths (SKILL.md first, then the resources, sorted).
    """
    files = package_or_paths.files if isinstance(package_or_paths, SkillPackage) else package_or_paths
    paths = frozenset(files)
    available = [SKILL_FILE, *resource_paths(paths)] if SKILL_FILE in paths else resource_paths(paths)
    hint = f"load {SKILL_FILE} or one of the skill's files: {', '.join(available)}"
    if not isinstance(requested, str) or not requested.strip():
        raise SkillPathRefused(f"the path is empty: {hint}")
    if len(requested) > 4 * MAX_PATH_CHARS:
        raise SkillPathRefused(f"the path is {len(requested)} characters long; at most {MAX_PATH_CHARS}")
    if problem := _characters_problem(requested):
        raise SkillPathRefused(problem)
    path = unicodedata.normalize("NFC", requested.replace("\\", "/"))
    if path.startswith("/"):
        raise SkillPathRefused(f"path {show(requested)} is absolute; paths are relative to the skill: {hint}")
    folder = path.endswith("/")
    parts = path.removesuffix("/").split("/")
    for part in parts:
        if part == ".":
            raise SkillPathRefused(f"path {show(requested)} uses '.', which is the skill's folder, not a file: {hint}")
        if part == "":
            raise SkillPathRefused(f"path {show(requested)} has an empty segment: {hint}")
        if problem := _segment_problem(requested, part):
            raise SkillPathRefused(problem)
        if part.startswith("."):
            raise SkillPathRefused(f"path {show(requested)} is hidden (a segment starts with '.'); "
                                   "hidden files are not served")
    path = "/".join(parts)
    if problem := _length_problem(path, parts, max_chars=MAX_PATH_CHARS, max_depth=MAX_DEPTH):
        raise SkillPathRefused(problem)
    if any(p.startswith(path + "/") for p in available):  # (a folder of hidden files only is no folder here)
        raise SkillPathRefused(f"path {show(requested)} is a directory; name a file in it: {hint}")
    if folder or path not in paths:
        raise SkillPathMissing(requested, available)
    return path


# --- front matter ----------------------------------------------------------------------------------

def allowed_tools_list(value) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [item.strip() for item in value if isinstance(item, str) and item.strip()]
    return []


def _split_front_matter(text: str) -> tuple[str, str]:
    """(front matter, body) of SKILL.md's text; ValueError when the `---` lines are not there."""
    lines = text.split("\n")
    if lines[0].rstrip() != "---":
        raise ValueError(f"{SKILL_FILE} must start with a '---' line, then the YAML front matter, then '---'")
    for index in range(1, len(lines)):
        if lines[index].rstrip() == "---":
            body = "\n".join(lines[index + 1:]).lstrip("\n").rstrip()
            return "\n".join(lines[1:index]), body
    raise ValueError(f"{SKILL_FILE}'s front matter is not closed: add a '---' line after it")


def _parse_front_matter(source: str) -> tuple[object, list[str]]:
    """The front matter's value, read by `common.documents` (bounded before anything is built: size,
    nesting, values; anchors, aliases and repeated keys refused), or the problem."""
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > MAX_FRONT_MATTER_BYTES:
        return None, [f"front matter is {size} bytes; at most {MAX_FRONT_MATTER_BYTES}"]
    try:
        return yaml_parse(source, max_bytes=MAX_FRONT_MATTER_BYTES, max_nodes=MAX_FRONT_MATTER_VALUES,
                          max_depth=MAX_FRONT_MATTER_NESTING, unique_keys=True), []
    except DocumentRefused as exc:
        return None, [_front_matter_problem(exc)]


def _front_matter_problem(exc: DocumentRefused) -> str:
    if exc.kind == "anchor":
        return "front matter uses YAML anchors or aliases (&name, *name); write the values out"
    if exc.kind == "nesting":
        return f"front matter is nested more than {MAX_FRONT_MATTER_NESTING} levels deep"
    if exc.kind == "nodes":
        return f"front matter has more than {MAX_FRONT_MATTER_VALUES} values (scalars, keys, lists and mappings)"
    if exc.kind == "duplicate":
        return f"front matter field {show(exc.key)} appears more than once"
    if exc.kind == "syntax":
        at = f" (line {exc.line + 1}, column {exc.column} of {SKILL_FILE})" if exc.line is not None else ""
        return f"front matter is not valid YAML{at}: {exc.reason}"
    return f"front matter cannot be read: {exc}"


def _string_field(fields: dict, key: str, limit: int, problems: list[str], *, required: bool) -> str | None:
    if key not in fields:
        if required:
            problems.append(f"{key} is required")
        return None
    value = fields[key]
    if not isinstance(value, str):
        problems.append(f"{key} must be a string, not {_yaml_type(value)}")
        return None
    value = value.strip()
    if not value:
        problems.append(f"{key} is empty")
        return None
    if len(value) > limit:
        problems.append(f"{key} is {len(value)} characters; at most {limit}")
        return None
    return value


def _yaml_type(value) -> str:
    kinds = {dict: "a mapping", list: "a list", str: "a string", bool: "true/false", int: "a number",
             float: "a number", type(None): "empty"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def _name_problems(name: str, folder: str | None) -> list[str]:
    problems = []
    if len(name) > MAX_NAME_CHARS:
        problems.append(f"name {show(name)} is {len(name)} characters; at most {MAX_NAME_CHARS}")
    if not NAME_CHARS.fullmatch(name):
        problems.append(f"name {show(name)} must be lowercase letters, digits and hyphens")
    if name.startswith("-") or name.endswith("-"):
        problems.append(f"name {show(name)} must not start or end with a hyphen")
    if "--" in name:
        problems.append(f"name {show(name)} must not contain '--'")
    if folder is not None and name != folder:
        problems.append(f"name {show(name)} must equal the folder name {show(folder)}")
    return problems


def _front_matter_fields(data, folder: str | None, problems: list[str]) -> dict:
    if data is None:
        problems.append("front matter is empty: name and description are required")
        return {}
    if not isinstance(data, dict):
        problems.append(f"front matter must be a YAML mapping of fields, not {_yaml_type(data)}")
        return {}
    fields: dict = {}
    for key in data:
        if key not in ALLOWED_FIELDS:
            problems.append(f"unknown front matter field {show(str(key))} (allowed: {', '.join(ALLOWED_FIELDS)})")
    name = data.get("name")
    if "name" not in data:
        problems.append("name is required")
    elif not isinstance(name, str):
        problems.append(f"name must be a string, not {_yaml_type(name)}")
    elif not name:
        problems.append("name is empty")
    else:
        name_problems = _name_problems(name, folder)
        problems.extend(name_problems)
        if not name_problems:
            fields["name"] = name
    for key, limit, required in (("description", MAX_DESCRIPTION_CHARS, True),
                                 ("license", MAX_LICENSE_CHARS, False),
                                 ("compatibility", MAX_COMPATIBILITY_CHARS, False)):
        value = _string_field(data, key, limit, problems, required=required)
        if value is not None:
            fields[key] = value
    if "metadata" in data:
        metadata = _metadata(data["metadata"], problems)
        if metadata is not None:
            fields["metadata"] = metadata
    if "allowed-tools" in data:
        tools = _allowed_tools(data["allowed-tools"], problems)
        if tools is not None:
            fields["allowed-tools"] = tools
    return fields


def _metadata(value, problems: list[str]) -> dict[str, str] | None:
    if not isinstance(value, dict):
        problems.append(f"metadata must be a mapping of strings to strings, not {_yaml_type(value)}")
        return None
    if len(value) > MAX_METADATA_ENTRIES:
        problems.append(f"metadata has {len(value)} entries; at most {MAX_METADATA_ENTRIES}")
        return None
    found = len(problems)
    for key, item in value.items():
        if not isinstance(key, str):
            problems.append(f"metadata key {show(str(key))} must be a string")
        elif not isinstance(item, str):
            hint = f' (quote it: {key}: "{item}")' if isinstance(item, int | float | bool) else ""
            problems.append(f"metadata {show(key)} must be a string, not {_yaml_type(item)}{hint}")
        elif len(key) > MAX_METADATA_CHARS or len(item) > MAX_METADATA_CHARS:
            problems.append(f"metadata {show(key)} is too long; keys and values have at most "
                            f"{MAX_METADATA_CHARS} characters")
    return dict(value) if len(problems) == found else None


def _allowed_tools(value, problems: list[str]) -> str | list[str] | None:
    """The spec: a space-separated string (experimental). Lists of strings are accepted too (the reference
    validator does not check the field; several agents write lists)."""
    if isinstance(value, str):
        if len(value) > MAX_DESCRIPTION_CHARS:
            problems.append(f"allowed-tools is {len(value)} characters; at most {MAX_DESCRIPTION_CHARS}")
            return None
        return value.strip()
    if isinstance(value, list) and all(isinstance(item, str) and item.strip() for item in value):
        if sum(len(item) + 1 for item in value) > MAX_DESCRIPTION_CHARS:
            problems.append(f"allowed-tools is longer than {MAX_DESCRIPTION_CHARS} characters")
            return None
        return [item.strip() for item in value]
    problems.append("allowed-tools must be a space-separated string of tool names or a list of tool names")
    return None


def _skill_text(raw: bytes, problems: list[str]) -> str | None:
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        problems.append(f"{SKILL_FILE} is UTF-16; save it as UTF-8")
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.append(f"{SKILL_FILE} is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                        "save it as UTF-8")
        return None
    text = text.removeprefix("\ufeff").replace("\r\n", "\n")
    if "\x00" in text:
        problems.append(f"{SKILL_FILE} contains a NUL character; it must be text")
        return None
    return text


# --- packages ------------------------------------------------------------------------------------

def files_digest(files: Mapping[str, bytes]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        encoded = path.encode("utf-8")
        content = files[path]
        digest.update(len(encoded).to_bytes(8, "big") + encoded + len(content).to_bytes(8, "big"))
        digest.update(content)
    return digest.hexdigest()


def _files_problems(files: Mapping[str, bytes]) -> tuple[dict[str, bytes], set[str], list[str]]:
    """The acceptable files under their normalised paths, every well-formed path seen (a file refused for
    its size included), and every problem with paths, duplicates and sizes."""
    problems: list[str] = []
    clean: dict[str, bytes] = {}
    folded: dict[str, str] = {}
    total = 0
    for raw, content in files.items():
        try:
            path = normalised_path(raw)
        except SkillPathRefused as exc:
            problems.append(str(exc))
            continue
        if not isinstance(content, bytes | bytearray | memoryview):
            problems.append(f"file {show(path)} is not bytes")
            continue
        content = bytes(content)
        key = path.casefold()
        if key in folded:
            same = "the same path" if folded[key] == path else f"the same path as {show(folded[key])} ignoring case"
            problems.append(f"file {show(raw)} is listed twice ({same})")
            continue
        folded[key] = path
        if len(content) > MAX_FILE_BYTES:
            problems.append(f"file {show(path)} is {len(content)} bytes; at most {MAX_FILE_BYTES}")
            continue
        total += len(content)
        clean[path] = content
    if total > MAX_TOTAL_BYTES:
        problems.append(f"the files add up to {total} bytes; at most {MAX_TOTAL_BYTES}")
    folders = {key.rsplit("/", depth)[0] for key in folded for depth in range(1, key.count("/") + 1)}
    for key in sorted(folders & set(folded)):
        problems.append(f"{show(folded[key])} is both a file and a folder")
    return clean, set(folded.values()), problems


def package_from_files(files: Mapping[str, bytes], *, folder: str | None = None) -> SkillPackage:
    """A validated package from its files ({relative path: content}); PackageProblems lists every problem.

    `folder`: the folder's name when known (a platform folder, an archive's top folder, the skill being
    updated); the front matter's name must equal it."""
    if len(files) > MAX_FILES:
        raise PackageProblems([f"the package has {len(files)} files; at most {MAX_FILES}"])
    clean, seen, problems = _files_problems(files)
    skill_raw = clean.get(SKILL_FILE)
    if skill_raw is None:
        if SKILL_FILE not in seen:  # (when it is there but refused, its problem is listed already)
            near = [path for path in seen if path.rsplit("/", 1)[-1].casefold() == SKILL_FILE.casefold()]
            found = f" (found {', '.join(show(p) for p in sorted(near))})" if near else ""
            problems.append(f"{SKILL_FILE} is missing: it must be at the top of the skill's folder{found}")
        raise PackageProblems(problems)
    text = _skill_text(skill_raw, problems)
    fields: dict = {}
    body = ""
    if text is not None:
        try:
            source, body = _split_front_matter(text)
        except ValueError as exc:
            problems.append(str(exc))
        else:
            data, yaml_problems = _parse_front_matter(source)
            problems.extend(yaml_problems)
            if not yaml_problems:
                fields = _front_matter_fields(data, folder, problems)
    if problems:
        raise PackageProblems(problems)
    ordered = {key: fields[key] for key in ALLOWED_FIELDS if key in fields}
    return SkillPackage(name=fields["name"], description=fields["description"], front_matter=ordered,
                        body=body, files={path: clean[path] for path in sorted(clean)})


def _read_regular(path: Path, relative: str) -> bytes:
    """A regular file's content, never through a symlink, never more than MAX_FILE_BYTES + 1 bytes read
    (ValueError saying why not)."""
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(descriptor, "rb") as handle:
        status = os.fstat(handle.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise ValueError(f"{show(relative)} is not a regular file")
        if status.st_size > MAX_FILE_BYTES:
            raise ValueError(f"file {show(relative)} is {status.st_size} bytes; at most {MAX_FILE_BYTES}")
        return handle.read(MAX_FILE_BYTES + 1)  # (a file that grew since is refused by the size check)


def package_from_folder(path: Path) -> SkillPackage:
    """A skill folder on disk (a platform skill): its name is the skill's. Symlinks and anything that is
    not a regular file or a directory are refused; the limits of uploads apply."""
    root = Path(path)
    problems: list[str] = []
    if root.is_symlink() or not root.is_dir():
        raise PackageProblems([f"{show(str(root))} is not a folder"])
    files: dict[str, bytes] = {}
    entries = 0
    pending = [(root, "")]
    while pending:
        directory, prefix = pending.pop()
        with os.scandir(directory) as listing:
            children = sorted(listing, key=lambda entry: entry.name)
        for entry in children:
            entries += 1
            if entries > MAX_ENTRIES:
                raise PackageProblems([f"the folder has more than {MAX_ENTRIES} entries"])
            relative = f"{prefix}{entry.name}"
            if entry.is_symlink():
                problems.append(f"{show(relative)} is a symbolic link; only regular files are allowed")
            elif entry.is_dir(follow_symlinks=False):
                if relative.count("/") + 1 >= MAX_DEPTH:
                    problems.append(f"folder {show(relative)} is too deep; paths have at most {MAX_DEPTH} levels")
                else:
                    pending.append((Path(entry.path), relative + "/"))
            elif entry.is_file(follow_symlinks=False):
                try:
                    files[relative] = _read_regular(Path(entry.path), relative)
                except ValueError as exc:
                    problems.append(str(exc))
                except OSError as exc:
                    problems.append(f"{show(relative)} cannot be read: {exc.strerror or exc}")
            else:
                problems.append(f"{show(relative)} is not a regular file")
    if problems:
        raise PackageProblems(problems)
    return package_from_files(files, folder=root.name)


def platform_skill_folders(base: Path = PLATFORM_DIR) -> list[Path]:
    """The platform's skill folders: `skills/<name>/` holding a SKILL.md (code folders hold none)."""
    return sorted(child for child in base.iterdir()
                  if child.is_dir() and not child.is_symlink() and NAME_CHARS.fullmatch(child.name)
                  and (child / SKILL_FILE).is_file())


def platform_packages(base: Path = PLATFORM_DIR) -> list[SkillPackage]:
    """Every platform skill, validated (PackageProblems if one is broken: a shipped skill must be valid)."""
    return [package_from_folder(folder) for folder in platform_skill_folders(base)]
