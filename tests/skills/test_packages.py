"""Skill packages (skills.packages): the Agent Skills rules, every problem listed, the path rules of
`load_skill_through_path`, and the platform's own skills. Pure functions: no database."""
import os
import re
import socket
import time
import unicodedata
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from common import documents
from knowledge.selectors import MAX_QUERY_CHARS, MAX_TOP_K
from skills import packages
from skills.packages import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_FILES,
    MAX_FRONT_MATTER_BYTES,
    MAX_PATH_CHARS,
    MAX_TOTAL_BYTES,
    PackageProblems,
    SkillPackage,
    SkillPathError,
    SkillPathMissing,
    SkillPathRefused,
    is_hidden,
    normalised_path,
    package_from_files,
    package_from_folder,
    platform_packages,
    skill_path,
)

PLATFORM = Path(packages.__file__).resolve().parent
# the parser's own words: libyaml's when PyYAML has it (common.documents), the pure-Python one's otherwise
UNCLOSED = ("front matter is not valid YAML (line 4, column 1 of SKILL.md): did not find expected ',' or ']'"
            if documents.CParser is not None else
            "front matter is not valid YAML (line 3, column 23 of SKILL.md): expected ',' or ']', "
            "but got '<stream end>'")
ALLOWED = "allowed: name, description, license, compatibility, metadata, allowed-tools"


def skill_md(front_matter: str = "name: demo-skill\ndescription: Does a demo thing.",
             body: str = "# Demo\n\nDo the thing.\n") -> bytes:
    return f"---\n{front_matter}\n---\n{body}".encode()


def problems_of(files, folder="demo-skill") -> list[str]:
    with pytest.raises(PackageProblems) as caught:
        package_from_files(files, folder=folder)
    return caught.value.problems


def front_matter_problems(front_matter: str, folder=None) -> list[str]:
    return problems_of({"SKILL.md": skill_md(front_matter)}, folder=folder)


# --- good packages ----------------------------------------------------------------------------------

def test_a_minimal_package():
    package = package_from_files({"SKILL.md": skill_md()}, folder="demo-skill")
    assert package.name == "demo-skill"
    assert package.description == "Does a demo thing."
    assert package.front_matter == {"name": "demo-skill", "description": "Does a demo thing."}
    assert package.body == "# Demo\n\nDo the thing."
    assert package.files == {"SKILL.md": skill_md()}
    assert package.resource_paths() == []
    assert package.available_paths() == ["SKILL.md"]
    assert package.allowed_tools == []


def test_every_known_field_is_kept_in_order():
    front_matter = ("allowed-tools: knowledge_search current_time\nmetadata:\n  author: acme\n  version: \"1.0\"\n"
                    "compatibility: Needs the knowledge group.\nlicense: Apache-2.0\n"
                    "description: >-\n  Folded\n  description.\nname: demo-skill")
    package = package_from_files({"SKILL.md": skill_md(front_matter)}, folder="demo-skill")
    assert list(package.front_matter) == ["name", "description", "license", "compatibility", "metadata",
                                          "allowed-tools"]
    assert package.description == "Folded description."
    assert package.front_matter["metadata"] == {"author": "acme", "version": "1.0"}
    assert package.allowed_tools == ["knowledge_search", "current_time"]


def test_allowed_tools_may_be_a_list():
    package = package_from_files({"SKILL.md": skill_md(
        "name: demo-skill\ndescription: d\nallowed-tools: [knowledge_search, current_time]")})
    assert package.allowed_tools == ["knowledge_search", "current_time"]


def test_without_a_folder_the_name_is_not_compared():
    assert package_from_files({"SKILL.md": skill_md()}).name == "demo-skill"


def test_bom_and_crlf_are_fine():
    raw = b"\xef\xbb\xbf" + skill_md().replace(b"\n", b"\r\n")
    package = package_from_files({"SKILL.md": raw}, folder="demo-skill")
    assert package.name == "demo-skill" and package.body == "# Demo\n\nDo the thing."
    assert package.files["SKILL.md"] == raw  # stored as uploaded


def test_resources_are_sorted_and_hidden_ones_are_not_listed():
    package = package_from_files({
        "SKILL.md": skill_md(), "scripts/run.sh": b"echo", "references/b.md": b"B", "references/a.md": b"A",
        ".env": b"SECRET=1", "assets/.DS_Store": b"\0", "data/archive.zip": b"PK\x03\x04 never opened",
    }, folder="demo-skill")
    assert package.resource_paths() == ["data/archive.zip", "references/a.md", "references/b.md", "scripts/run.sh"]
    assert ".env" in package.files and "assets/.DS_Store" in package.files  # kept, never served
    assert list(package.files) == sorted(package.files)


def test_paths_are_normalised():
    nfd = unicodedata.normalize("NFD", "notes/café.md")
    package = package_from_files({"SKILL.md": skill_md(), "a/./b.md": b"1", "c//d.md": b"2", nfd: b"3"})
    assert sorted(package.files) == ["SKILL.md", "a/b.md", "c/d.md", "notes/café.md"]


def test_the_digest_tells_versions_apart():
    first = package_from_files({"SKILL.md": skill_md(), "a.md": b"one"})
    same = package_from_files({"a.md": b"one", "SKILL.md": skill_md()})
    changed = package_from_files({"SKILL.md": skill_md(), "a.md": b"two"})
    renamed = package_from_files({"SKILL.md": skill_md(), "b.md": b"one"})
    assert first.digest() == same.digest() and first == same and hash(first) == hash(same)
    assert len({first.digest(), changed.digest(), renamed.digest()}) == 3
    assert len(first.digest()) == 64


# --- the platform's skills ---------------------------------------------------------------------------

@pytest.mark.parametrize(("folder", "tools"), [
    ("incident-triage", ["knowledge_search", "current_time", "todo_write"]),
    ("call-history-review", ["call_history_report"]),
])
def test_the_platform_skills_are_valid(folder, tools):
    package = package_from_folder(PLATFORM / folder)
    assert package.name == folder
    assert package.allowed_tools == tools
    assert package.resource_paths()
    assert len(package.body.splitlines()) <= 120
    for path in package.resource_paths():
        assert f"`{path}`" in package.body  # every resource is introduced by the instructions
        package.files[path].decode("utf-8")
    for tool in tools:
        assert tool in package.body


def test_platform_packages_lists_the_skill_folders_only():
    names = [package.name for package in platform_packages()]
    assert {"incident-triage", "call-history-review"} <= set(names)
    assert names == sorted(names)


def test_the_skills_match_the_real_tools():
    triage = package_from_folder(PLATFORM / "incident-triage").body
    assert f"at most {MAX_QUERY_CHARS} characters" in triage and f"1 to {MAX_TOP_K}" in triage
    assert "`handbook`" in triage and "BoundArgumentOverride" in triage
    review = package_from_folder(PLATFORM / "call-history-review").body
    for key in ("total_calls", "per_tool", "per_day", "success_rate", "avg_ms", "other", "1 to 90"):
        assert key in review


# --- the rules of the front matter -------------------------------------------------------------------

@pytest.mark.parametrize(("front_matter", "problem"), [
    ("name: Foo\ndescription: d", 'name "Foo" must be lowercase letters, digits and hyphens'),
    ("name: demo_skill\ndescription: d", 'name "demo_skill" must be lowercase letters, digits and hyphens'),
    ("name: démo\ndescription: d", 'name "démo" must be lowercase letters, digits and hyphens'),
    ("name: -demo\ndescription: d", 'name "-demo" must not start or end with a hyphen'),
    ("name: demo-\ndescription: d", 'name "demo-" must not start or end with a hyphen'),
    ("name: demo--skill\ndescription: d", "name \"demo--skill\" must not contain '--'"),
    (f"name: {'a' * 65}\ndescription: d", f'name "{"a" * 65}" is 65 characters; at most 64'),
    ("description: d", "name is required"),
    ("name: ''\ndescription: d", "name is empty"),
    ("name: 42\ndescription: d", "name must be a string, not a number"),
    ("name: demo-skill", "description is required"),
    ("name: demo-skill\ndescription: '   '", "description is empty"),
    (f"name: demo-skill\ndescription: {'x' * 1100}", "description is 1100 characters; at most 1024"),
    ("name: demo-skill\ndescription: [a, b]", "description must be a string, not a list"),
    (f"name: demo-skill\ndescription: d\ncompatibility: {'c' * 501}", "compatibility is 501 characters; at most 500"),
    ("name: demo-skill\ndescription: d\nlicense: 2024-01-01", "license must be a string, not a date"),
    ("name: demo-skill\ndescription: d\nmetadata: [a]", "metadata must be a mapping of strings to strings, not a list"),
    ("name: demo-skill\ndescription: d\nmetadata:\n  version: 1.0",
     'metadata "version" must be a string, not a number (quote it: version: "1.0")'),
    ("name: demo-skill\ndescription: d\nmetadata:\n  tags: {a: b}", 'metadata "tags" must be a string, not a mapping'),
    ("name: demo-skill\ndescription: d\nallowed-tools: {a: b}",
     "allowed-tools must be a space-separated string of tool names or a list of tool names"),
    ("name: demo-skill\ndescription: d\nauthor: me", f'unknown front matter field "author" ({ALLOWED})'),
    ("name: demo-skill\ndescription: d\nallowed_tools: x", f'unknown front matter field "allowed_tools" ({ALLOWED})'),
])
def test_each_rule_names_its_problem(front_matter, problem):
    assert front_matter_problems(front_matter) == [problem]


def test_the_name_must_equal_the_folder_name():
    assert front_matter_problems("name: a-skill\ndescription: d", folder="b-skill") == [
        'name "a-skill" must equal the folder name "b-skill"']


def test_every_problem_is_listed_at_once():
    problems = front_matter_problems(f"name: Foo\ndescription: {'x' * 1100}\nauthor: me\nversion: 2\n"
                                     f"compatibility: {'c' * 501}", folder="foo")
    assert problems == [
        f'unknown front matter field "author" ({ALLOWED})',
        f'unknown front matter field "version" ({ALLOWED})',
        'name "Foo" must be lowercase letters, digits and hyphens',
        'name "Foo" must equal the folder name "foo"',
        "description is 1100 characters; at most 1024",
        "compatibility is 501 characters; at most 500",
    ]
    with pytest.raises(PackageProblems, match="the skill package has 6 problems: unknown front matter"):
        package_from_files({"SKILL.md": skill_md(f"name: Foo\ndescription: {'x' * 1100}\nauthor: me\nversion: 2\n"
                                                 f"compatibility: {'c' * 501}")}, folder="foo")


def test_problems_with_files_and_front_matter_come_together():
    problems = problems_of({"SKILL.md": skill_md("name: demo-skill\ndescription: d\nauthor: me"),
                            "../escape.md": b"x", "big.bin": b"\0" * (MAX_FILE_BYTES + 1)})
    assert problems == [
        "path \"../escape.md\" leaves the skill folder ('..')",
        f'file "big.bin" is {MAX_FILE_BYTES + 1} bytes; at most {MAX_FILE_BYTES}',
        f'unknown front matter field "author" ({ALLOWED})',
    ]


# --- SKILL.md itself ------------------------------------------------------------------------------

@pytest.mark.parametrize(("files", "problem"), [
    ({"README.md": b"# hi"}, "SKILL.md is missing: it must be at the top of the skill's folder"),
    ({"skill.md": skill_md()}, 'SKILL.md is missing: it must be at the top of the skill\'s folder (found "skill.md")'),
    ({"docs/SKILL.md": skill_md()},
     'SKILL.md is missing: it must be at the top of the skill\'s folder (found "docs/SKILL.md")'),
    ({"SKILL.md": b"---\nname: demo-skill\ndescription: caf\xe9\n---\n"},
     "SKILL.md is not valid UTF-8 (byte 0xe9 at offset 37); save it as UTF-8"),
    ({"SKILL.md": b"\xff\xfe-\x00-\x00-\x00"}, "SKILL.md is UTF-16; save it as UTF-8"),
    ({"SKILL.md": b"---\nname: demo-skill\x00\n---\n"}, "SKILL.md contains a NUL character; it must be text"),
    ({"SKILL.md": b"# Demo\n\nNo front matter."},
     "SKILL.md must start with a '---' line, then the YAML front matter, then '---'"),
    ({"SKILL.md": b"---\nname: demo-skill\ndescription: d\n"},
     "SKILL.md's front matter is not closed: add a '---' line after it"),
    ({"SKILL.md": skill_md("")}, "front matter is empty: name and description are required"),
    ({"SKILL.md": skill_md("- name\n- description")}, "front matter must be a YAML mapping of fields, not a list"),
    ({"SKILL.md": skill_md("just words")}, "front matter must be a YAML mapping of fields, not a string"),
    ({"SKILL.md": skill_md("name: demo-skill\ndescription: [unclosed")}, UNCLOSED),
    ({"SKILL.md": skill_md("name: demo-skill\nname: demo-skill\ndescription: d")},
     'front matter field "name" appears more than once'),
    ({"SKILL.md": skill_md("name: demo-skill\ndescription: d\nmetadata: " + "[" * 12 + "]" * 12)},
     "front matter is nested more than 8 levels deep"),
])
def test_skill_md_problems(files, problem):
    assert problems_of(files) == [problem]


def test_yaml_bomb_is_refused_at_once():
    """Billion laughs: nine levels of nine aliases would build 9**9 strings."""
    levels = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    started = time.monotonic()
    problems = front_matter_problems("\n".join([*levels, "name: demo-skill", "description: d"]))
    assert time.monotonic() - started < 1
    assert problems == ["front matter uses YAML anchors or aliases (&name, *name); write the values out"]


def test_even_a_harmless_anchor_is_refused():
    assert front_matter_problems("name: &n demo-skill\ndescription: *n") == [
        "front matter uses YAML anchors or aliases (&name, *name); write the values out"]


def test_python_tags_are_never_constructed(tmp_path):
    marker = tmp_path / "ran"
    problems = front_matter_problems(
        f"name: !!python/object/apply:os.system ['touch {marker}']\ndescription: d")
    assert len(problems) == 1 and problems[0].startswith("front matter is not valid YAML (line 2, column 7")
    assert "could not determine a constructor" in problems[0]
    assert not marker.exists()


def test_front_matter_size_is_capped():
    padding = "#" + "x" * MAX_FRONT_MATTER_BYTES
    assert front_matter_problems(f"name: demo-skill\ndescription: d\n{padding}") == [
        f"front matter is {MAX_FRONT_MATTER_BYTES + 33} bytes; at most {MAX_FRONT_MATTER_BYTES}"]


# --- files: limits, duplicates, paths ----------------------------------------------------------------

def test_too_many_files():
    files = {"SKILL.md": skill_md(), **{f"r/{i}.md": b"" for i in range(MAX_FILES)}}
    assert problems_of(files) == [f"the package has {MAX_FILES + 1} files; at most {MAX_FILES}"]


def test_too_large_a_file_and_too_large_a_total():
    assert problems_of({"SKILL.md": skill_md(), "big.bin": b"\0" * (MAX_FILE_BYTES + 1)}) == [
        f'file "big.bin" is {MAX_FILE_BYTES + 1} bytes; at most {MAX_FILE_BYTES}']
    many = {f"part{i}.bin": b"\0" * MAX_FILE_BYTES for i in range(MAX_TOTAL_BYTES // MAX_FILE_BYTES)}
    total = len(skill_md()) + MAX_TOTAL_BYTES
    assert problems_of({"SKILL.md": skill_md(), **many}) == [
        f"the files add up to {total} bytes; at most {MAX_TOTAL_BYTES}"]


def test_a_refused_skill_md_is_not_also_reported_missing():
    assert problems_of({"SKILL.md": b"x" * (MAX_FILE_BYTES + 1)}) == [
        f'file "SKILL.md" is {MAX_FILE_BYTES + 1} bytes; at most {MAX_FILE_BYTES}']


@pytest.mark.parametrize(("paths", "problem"), [
    (["a.md", "A.md"], 'file "A.md" is listed twice (the same path as "a.md" ignoring case)'),
    (["a/b.md", "a/./b.md"], 'file "a/./b.md" is listed twice (the same path)'),
    (["notes/é.md", unicodedata.normalize("NFD", "notes/é.md")],
     f'file "{unicodedata.normalize("NFD", "notes/é.md")}" is listed twice (the same path)'),
    (["ref", "ref/a.md"], '"ref" is both a file and a folder'),
    (["Ref", "ref/a.md"], '"Ref" is both a file and a folder'),
])
def test_duplicates_and_clashes(paths, problem):
    assert problems_of({"SKILL.md": skill_md(), **{path: b"x" for path in paths}}) == [problem]


ATTACKS = [
    ("../x", "path \"../x\" leaves the skill folder ('..')"),
    ("a/../../x", "path \"a/../../x\" leaves the skill folder ('..')"),
    ("a/../b", "path \"a/../b\" leaves the skill folder ('..')"),
    ("/etc/passwd", "path \"/etc/passwd\" is absolute (it starts with '/')"),
    ("C:\\x", 'path "C:\\x" starts with a drive letter (C:)'),
    ("C:/x", 'path "C:/x" starts with a drive letter (C:)'),
    ("a\\..\\b", "path \"a\\..\\b\" contains a backslash; use '/' between folders"),
    ("%2e%2e/x", 'path "%2e%2e/x" contains percent-encoding (%2e); send the plain path'),
    ("a%2fb", 'path "a%2fb" contains percent-encoding (%2f); send the plain path'),
    ("%252e%252e/x", 'path "%252e%252e/x" contains percent-encoding (%25); send the plain path'),
    ("\uff0e\uff0e/x", "path \"\uff0e\uff0e/x\" contains U+FF0E FULLWIDTH FULL STOP, which looks like '.'; "
                       "use plain characters"),
    ("\u2024\u2024/x", "path \"\u2024\u2024/x\" contains U+2024 ONE DOT LEADER, which looks like '.'; "
                       "use plain characters"),
    ("\u2025/x", "path \"\u2025/x\" contains U+2025 TWO DOT LEADER, which looks like '.'; use plain characters"),
    ("..\u2215x", "path \"..\u2215x\" contains U+2215 DIVISION SLASH, which looks like '/'; use plain characters"),
    ("..\uff0fx", "path \"..\uff0fx\" contains U+FF0F FULLWIDTH SOLIDUS, which looks like '/'; use plain characters"),
    ("a\u2044b", "path \"a\u2044b\" contains U+2044 FRACTION SLASH, which looks like '/'; use plain characters"),
    ("..\uff3cx", "path \"..\uff3cx\" contains U+FF3C FULLWIDTH REVERSE SOLIDUS, which looks like '\\\\'; "
                  "use plain characters"),
    ("a\x00b", 'path "a\\u0000b" contains a NUL character'),
    ("a\x1b[2Jb", 'path "a\\u001b[2Jb" contains a control character (U+001B <control>)'),
    ("a\nb", 'path "a\\u000ab" contains a control character (U+000A <control>)'),
    ("evil\u202egnp.md", 'path "evil\\u202egnp.md" contains an invisible or unassigned character '
                         "(U+202E RIGHT-TO-LEFT OVERRIDE)"),
    ("a\u200bb", 'path "a\\u200bb" contains an invisible or unassigned character (U+200B ZERO WIDTH SPACE)'),
    ("file.md:stream", "path \"file.md:stream\" contains ':'"),
    ("...", 'path "..." has a segment made only of dots and spaces ("...")'),
    (". ./x", 'path ". ./x" has a segment made only of dots and spaces (". .")'),
    ("a /b", 'path "a /b" has a segment that starts or ends with whitespace ("a ")'),
    ("notes.", 'path "notes." has a segment ending in a dot ("notes.")'),
    ("a/", "path \"a/\" ends with '/': it names a folder, not a file"),
    ("./", "path \"./\" ends with '/': it names a folder, not a file"),
    (".", 'path "." names no file'),
    ("", "a path is empty"),
    ("/".join(["d"] * MAX_DEPTH + ["x"]), f'path "{"d/" * MAX_DEPTH}x" is {MAX_DEPTH + 1} levels deep; '
                                            f"at most {MAX_DEPTH}"),
    ("x" * (MAX_PATH_CHARS + 1), f'path "{"x" * 80}…" is {MAX_PATH_CHARS + 1} characters long; '
                                 f"at most {MAX_PATH_CHARS}"),
]


@pytest.mark.parametrize(("path", "problem"), ATTACKS)
def test_hostile_paths_are_refused(path, problem):
    assert problems_of({"SKILL.md": skill_md(), path: b"x"}) == [problem]
    with pytest.raises(SkillPathRefused) as caught:
        normalised_path(path)
    assert str(caught.value) == problem


def test_non_bytes_content_is_refused():
    assert problems_of({"SKILL.md": skill_md(), "a.md": "text"}) == ['file "a.md" is not bytes']


@settings(deadline=None, max_examples=300)
@given(st.lists(st.sampled_from(["a", "B", ".", "/", "\\", "%", "2", "e", ":", " ", "\u2024", "\uff0e",
                                 "\u2215", "\uff0f", "\x00", "\u202e", "é", "e\u0301"]), max_size=12).map("".join))
@example("a/./b")
@example("a//b")
def test_a_normalised_path_is_plain_and_stable(raw):
    try:
        path = normalised_path(raw)
    except SkillPathRefused:
        return
    parts = path.split("/")
    assert path and not path.startswith("/") and "\\" not in path and ":" not in path
    assert not re.search("%[0-9A-Fa-f]{2}", path)
    assert all(part not in ("", ".", "..") for part in parts)
    assert not any(ch in path for ch in "\u2024\uff0e\u2215\uff0f\x00\u202e")
    assert normalised_path(path) == path == unicodedata.normalize("NFC", path)


# --- platform folders on disk ---------------------------------------------------------------------

def write_skill(folder: Path, name: str | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_bytes(skill_md(f"name: {name or folder.name}\ndescription: A skill on disk."))
    (folder / "references").mkdir()
    (folder / "references" / "notes.md").write_text("notes")
    return folder


def test_a_folder_on_disk(tmp_path):
    package = package_from_folder(write_skill(tmp_path / "disk-skill"))
    assert package.name == "disk-skill" and package.resource_paths() == ["references/notes.md"]


def test_the_folder_name_must_be_the_skills_name(tmp_path):
    with pytest.raises(PackageProblems) as caught:
        package_from_folder(write_skill(tmp_path / "disk-skill", name="other-skill"))
    assert caught.value.problems == ['name "other-skill" must equal the folder name "disk-skill"']


def test_symlinks_in_a_folder_are_refused(tmp_path):
    folder = write_skill(tmp_path / "disk-skill")
    (tmp_path / "secret.txt").write_text("secret")
    (folder / "leak.txt").symlink_to(tmp_path / "secret.txt")
    (folder / "up").symlink_to(tmp_path)
    with pytest.raises(PackageProblems) as caught:
        package_from_folder(folder)
    assert caught.value.problems == ['"leak.txt" is a symbolic link; only regular files are allowed',
                                     '"up" is a symbolic link; only regular files are allowed']


def test_a_symlinked_folder_is_refused(tmp_path):
    real = write_skill(tmp_path / "real" / "disk-skill")
    (tmp_path / "disk-skill").symlink_to(real)
    with pytest.raises(PackageProblems, match="is not a folder"):
        package_from_folder(tmp_path / "disk-skill")


def test_fifos_and_sockets_in_a_folder_are_refused(tmp_path, monkeypatch):
    folder = write_skill(tmp_path / "disk-skill")
    os.mkfifo(folder / "pipe")
    monkeypatch.chdir(folder)  # a socket's path has a short length limit
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind("sock")
        with pytest.raises(PackageProblems) as caught:
            package_from_folder(folder)
    finally:
        server.close()
    assert caught.value.problems == ['"pipe" is not a regular file', '"sock" is not a regular file']


def test_a_large_file_on_disk_is_read_no_further_than_the_cap(tmp_path):
    folder = write_skill(tmp_path / "disk-skill")
    with open(folder / "huge.bin", "wb") as handle:
        handle.truncate(64 * MAX_FILE_BYTES)  # sparse: 64 MiB that take no room
    with pytest.raises(PackageProblems) as caught:
        package_from_folder(folder)
    assert caught.value.problems == [f'file "huge.bin" is {64 * MAX_FILE_BYTES} bytes; at most {MAX_FILE_BYTES}']


# --- skill_path: what load_skill_through_path serves -----------------------------------------------

PACKAGE = package_from_files({
    "SKILL.md": skill_md(), "references/rubric.md": b"# Rubric", "assets/template.md": b"# Template",
    "notes.txt": b"notes", ".env": b"SECRET=1", "references/.hidden.md": b"hidden", "deep/a/b/c.md": b"c",
    ".git/config": b"[core]",
}, folder="demo-skill")
AVAILABLE = ["SKILL.md", "assets/template.md", "deep/a/b/c.md", "notes.txt", "references/rubric.md"]


@pytest.mark.parametrize(("requested", "path"), [
    ("SKILL.md", "SKILL.md"),
    ("references/rubric.md", "references/rubric.md"),
    ("references\\rubric.md", "references/rubric.md"),
    ("deep\\a/b\\c.md", "deep/a/b/c.md"),
    ("notes.txt", "notes.txt"),
])
def test_served_paths(requested, path):
    assert skill_path(PACKAGE, requested) == path
    assert skill_path(list(PACKAGE.files), requested) == path  # the stored paths will do as well


@pytest.mark.parametrize(("requested", "message"), [
    (".", "uses '.', which is the skill's folder, not a file"),
    ("./", "uses '.', which is the skill's folder, not a file"),
    ("./SKILL.md", "uses '.', which is the skill's folder, not a file"),
    ("references/./rubric.md", "uses '.', which is the skill's folder, not a file"),
    (".\\SKILL.md", "uses '.', which is the skill's folder, not a file"),
    ("/SKILL.md", "is absolute; paths are relative to the skill"),
    ("\\SKILL.md", "is absolute; paths are relative to the skill"),
    ("/etc/passwd", "is absolute; paths are relative to the skill"),
    ("..", "leaves the skill folder ('..')"),
    ("../demo-skill/SKILL.md", "leaves the skill folder ('..')"),
    ("references/../SKILL.md", "leaves the skill folder ('..')"),
    ("references\\..\\..\\x", "leaves the skill folder ('..')"),
    ("C:\\SKILL.md", "starts with a drive letter (C:)"),
    ("%2e%2e/x", "contains percent-encoding (%2e)"),
    ("references%2frubric.md", "contains percent-encoding (%2f)"),
    ("\uff0e\uff0e/x", "contains U+FF0E FULLWIDTH FULL STOP, which looks like '.'"),
    ("\u2024\u2024/x", "contains U+2024 ONE DOT LEADER, which looks like '.'"),
    ("references\u2215rubric.md", "contains U+2215 DIVISION SLASH, which looks like '/'"),
    ("references\uff0frubric.md", "contains U+FF0F FULLWIDTH SOLIDUS, which looks like '/'"),
    ("SKILL.md\x00.png", "contains a NUL character"),
    ("SKILL.md\r", "contains a control character"),
    ("references", "is a directory; name a file in it"),
    ("references/", "is a directory; name a file in it"),
    ("deep/a", "is a directory; name a file in it"),
    (".env", "is hidden (a segment starts with '.'); hidden files are not served"),
    (".git/config", "is hidden (a segment starts with '.'); hidden files are not served"),
    ("references/.hidden.md", "is hidden (a segment starts with '.'); hidden files are not served"),
    (".nothing-here", "is hidden (a segment starts with '.'); hidden files are not served"),
    ("references//rubric.md", "has an empty segment"),
    ("", "the path is empty"),
    ("   ", "the path is empty"),
])
def test_refused_paths(requested, message):
    with pytest.raises(SkillPathRefused) as caught:
        skill_path(PACKAGE, requested)
    assert message in str(caught.value)


def test_a_folder_of_hidden_files_only_is_not_revealed():
    with pytest.raises(SkillPathMissing):
        skill_path(package_from_files({"SKILL.md": skill_md(), "vault/.key": b"k"}), "vault")


def test_refusals_that_help_list_the_paths():
    with pytest.raises(SkillPathRefused) as caught:
        skill_path(PACKAGE, ".")
    assert str(caught.value).endswith(f"load SKILL.md or one of the skill's files: {', '.join(AVAILABLE)}")


@pytest.mark.parametrize("requested", ["missing.md", "skill.md", "references/rubric.MD", "assets/template.md/",
                                       "deep/a/b/c.md/d"])
def test_a_miss_lists_the_available_paths_in_order(requested):
    with pytest.raises(SkillPathMissing) as caught:
        skill_path(PACKAGE, requested)
    assert caught.value.available == AVAILABLE == PACKAGE.available_paths()
    assert str(caught.value) == (f'no file "{requested}" in this skill; available: SKILL.md, assets/template.md, '
                                 "deep/a/b/c.md, notes.txt, references/rubric.md")
    assert isinstance(caught.value, SkillPathError) and isinstance(caught.value, ValueError)


PATH_PIECES = st.sampled_from([
    "SKILL.md", "references", "rubric.md", "assets", "template.md", "notes.txt", "deep", "a", "b", "c.md",
    ".env", ".git", "config", ".hidden.md", ".", "..", "/", "\\", "%2e", "%2f", "\uff0e", "\u2024", "\u2215",
    "\uff0f", "\x00", " ", "C:", "é", "",
])


@settings(deadline=None, max_examples=500)
@given(st.lists(PATH_PIECES, max_size=7).map("".join))
@example("references\\rubric.md")
@example("deep/a/b/c.md")
def test_whatever_skill_path_accepts_is_one_of_the_served_files(requested):
    try:
        path = skill_path(PACKAGE, requested)
    except SkillPathError:
        return
    assert path in PACKAGE.files
    assert path in PACKAGE.available_paths()
    assert not is_hidden(path)


def test_the_package_is_a_frozen_value():
    with pytest.raises(AttributeError):
        PACKAGE.name = "other"  # type: ignore[misc]
    assert isinstance(PACKAGE, SkillPackage) and "files" not in repr(PACKAGE)
