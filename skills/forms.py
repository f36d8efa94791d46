"""Console forms of the skills pages: upload a package, expose a skill, bind a tool group to it.

An upload is a .zip, or the files of a folder (`<input type=file multiple webkitdirectory>`). Django keeps
only an uploaded file's base name (`MultiPartParser.sanitize_file_name` drops every folder), so the page's
script sends each file's path inside the folder in a `paths` field, in the files' order; a folder upload
without them (no script) is refused with the advice to upload a zip. Whatever the paths say, the package
checks (`skills.archives`) decide: nothing here trusts them.
"""
import html

from django import forms

from skills.archives import MAX_ARCHIVE_BYTES, package_from_upload, package_from_zip
from skills.packages import MAX_FILE_BYTES, MAX_FILES, MAX_TOTAL_BYTES, SkillPackage, show
from tools.models import RESERVED_GROUP, ToolGroup

MAX_AGENTS = 1000
MAX_AGENT_CHARS = 200


class MultipleFileInput(forms.FileInput):
    allow_multiple_selected = True


class FolderField(forms.FileField):
    """The files of a folder upload, in the order the browser sent them."""

    def __init__(self, **kwargs):
        kwargs.setdefault("widget", MultipleFileInput(attrs={"webkitdirectory": True, "data-relative-paths": True}))
        super().__init__(**kwargs)

    def clean(self, data, initial=None):
        files = data if isinstance(data, list | tuple) else ([data] if data else [])
        return [super(FolderField, self).clean(f, initial) for f in files] if files else []


def _base_name(path: str) -> str:
    """The name Django's multipart parser keeps of a file name (its `sanitize_file_name`)."""
    name = html.unescape(path).rsplit("/")[-1].rsplit("\\")[-1]
    return "".join(ch for ch in name if ch.isprintable())


class UploadForm(forms.Form):
    archive = forms.FileField(
        required=False, label="Zip archive", widget=forms.FileInput(attrs={"accept": ".zip,application/zip"}),
        help_text=f"SKILL.md at the top, or one folder named like the skill holding everything; at most "
                  f"{MAX_ARCHIVE_BYTES // (1024 * 1024)} MiB.")
    files = FolderField(
        required=False, label="Or a folder",
        help_text=f"The skill's folder (SKILL.md and its resources), at most {MAX_FILES} files. "
                  "Needs JavaScript, which sends each file's path inside the folder.")

    def clean(self):
        data = super().clean()
        archive, files = data.get("archive"), data.get("files") or []
        if bool(archive) == bool(files):
            raise forms.ValidationError("Choose a .zip archive or a folder (one of them).")
        if archive is not None and archive.size > MAX_ARCHIVE_BYTES:
            self.add_error("archive", f"{archive.size:,} bytes is too large; at most {MAX_ARCHIVE_BYTES:,} bytes.")
        if files:
            self._check_folder(files)
        return data

    def _check_folder(self, files) -> None:
        paths = self.data.getlist("paths") if hasattr(self.data, "getlist") else []
        if len(files) > MAX_FILES:
            self.add_error("files", f"The folder has {len(files)} files; at most {MAX_FILES}.")
        elif not paths:
            self.add_error("files", "The files came without their paths inside the folder (the page's script sends "
                                    "them). Upload the skill as a .zip archive instead.")
        elif len(paths) != len(files):
            self.add_error("files", f"{len(paths)} paths were sent for {len(files)} files; upload again, or upload "
                                    "a .zip archive.")
        else:
            mismatched = [path for path, upload in zip(paths, files, strict=True) if _base_name(path) != upload.name]
            if mismatched:
                self.add_error("files", "The paths sent do not match the files: "
                                        + ", ".join(show(path) for path in mismatched[:5]))
            total = sum(upload.size for upload in files)
            if total > MAX_TOTAL_BYTES:
                self.add_error("files", f"The files add up to {total:,} bytes; at most {MAX_TOTAL_BYTES:,}.")

    def package(self) -> SkillPackage:
        """The validated package of a valid form, or PackageProblems listing every problem."""
        archive = self.cleaned_data.get("archive")
        if archive is not None:
            return package_from_zip(archive.read(MAX_ARCHIVE_BYTES + 1))
        paths = self.data.getlist("paths")
        entries = []
        for path, upload in zip(paths, self.cleaned_data["files"], strict=True):
            # Read no more than one byte over the limit: the package check names the file as too large.
            entries.append((path, upload.read(MAX_FILE_BYTES + 1)))
        return package_from_upload(entries)


class ExposureForm(forms.Form):
    """Whether the skill is on, and which agents see it."""

    enabled = forms.BooleanField(required=False, label="Enabled",
                                 help_text="Off: no session sees the skill; sessions that loaded it keep its groups.")
    agents = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 3}), label="Agents that see it",
        help_text="One agent name per line (or separated by commas). Empty: every agent.")

    def clean_agents(self) -> list[str]:
        names = []
        for line in self.cleaned_data["agents"].replace(",", "\n").splitlines():
            name = line.strip()
            if name and name not in names:
                names.append(name)
        too_long = [name for name in names if len(name) > MAX_AGENT_CHARS]
        if too_long:
            raise forms.ValidationError(f"An agent name has at most {MAX_AGENT_CHARS} characters: {show(too_long[0])}.")
        if len(names) > MAX_AGENTS:
            raise forms.ValidationError(f"At most {MAX_AGENTS} agents.")
        return names


class GroupChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, group) -> str:
        return f"{group.name} (now bound to {group.skill_ref})" if group.skill_ref else group.name


class BindGroupForm(forms.Form):
    """A tool group of the tenant to bind to the skill: loading the skill then switches it on, for that session."""

    group = GroupChoiceField(queryset=ToolGroup.objects.none(), label="Bind a group",
                             help_text="A group bound to another skill moves to this one (a group names one skill).")

    def __init__(self, *args, tenant, skill, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["group"].queryset = (ToolGroup.objects.for_tenant(tenant).exclude(name=RESERVED_GROUP)
                                         .exclude(skill_ref=skill.name).order_by("name"))
