"""Console forms for datasets, uploads, trial searches and the knowledge_search scope."""
from django import forms

from common.json_values import JSONValueField
from knowledge.selectors import MAX_QUERY_CHARS, MAX_TOP_K, InvalidQuery, clean_filters
from knowledge.services import MAX_UPLOAD_BYTES
from tenancy.web import TenantForm

MAX_FILES_PER_UPLOAD = 1000  # over services.BATCH_SIZE, the upload runs as work with progress


class DatasetForm(TenantForm):
    name = forms.SlugField(max_length=100, help_text="Letters, digits, - and _. Bindings name the dataset by it.")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True


class MultipleFileField(forms.FileField):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("widget", MultipleFileInput(attrs={"accept": ".txt,.md,.markdown,text/plain,text/markdown"}))
        super().__init__(*args, **kwargs)

    def clean(self, data, initial=None):
        files = data if isinstance(data, list | tuple) else ([data] if data else [])
        if not files:
            raise forms.ValidationError("Choose at least one .txt or .md file.")
        return list(files)


def _metadata_field():
    return JSONValueField(
        required=False, initial=dict, widget=forms.Textarea(attrs={"rows": 2}),
        help_text='Optional JSON object given to every document, e.g. {"department": "hr", "visibility": "internal"}.')


class UploadForm(forms.Form):
    files = MultipleFileField(
        help_text=f"Text (.txt) or Markdown (.md) files, UTF-8, up to {MAX_UPLOAD_BYTES // 1024} KiB each; several at "
                  "once. A file with the same name as an existing document updates it.")
    metadata = _metadata_field()

    def clean_files(self):
        files = self.cleaned_data["files"]
        if len(files) > MAX_FILES_PER_UPLOAD:
            raise forms.ValidationError(f"At most {MAX_FILES_PER_UPLOAD} files at once.")
        return files

    def clean_metadata(self):
        value = self.cleaned_data["metadata"]
        if value in (None, ""):
            return {}
        if not isinstance(value, dict):
            raise forms.ValidationError('Use a JSON object, e.g. {"department": "hr"}.')
        return value


class SearchForm(forms.Form):
    agent = forms.CharField(max_length=100, required=False,
                            help_text="Search with this agent's bound scope. Empty: the tenant-wide scope.")
    query = forms.CharField(max_length=MAX_QUERY_CHARS, strip=True)
    top_k = forms.IntegerField(min_value=1, max_value=MAX_TOP_K, initial=5, required=False, label="Results")

    def clean_agent(self):
        return self.cleaned_data["agent"].strip()


class ScopeForm(forms.Form):
    """The knowledge_search scope for every agent (agent empty) or for one agent."""

    agent = forms.CharField(max_length=100, required=False,
                            help_text="Empty: every agent (the tenant-wide default). An agent's own scope replaces it.")
    all_datasets = forms.BooleanField(required=False, initial=True, label="All datasets",
                                      help_text="Every dataset of the tenant, including ones created later.")
    datasets = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple,
                                         help_text="Used when “All datasets” is off.")
    filter = JSONValueField(required=False, initial=dict, widget=forms.Textarea(attrs={"rows": 2}),
                            help_text='Metadata every result must match, e.g. {"department": "hr"}; a list means '
                                      'any of: {"department": ["hr", "it"]}. {} for none.')

    def __init__(self, *args, dataset_names=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["datasets"].choices = [(name, name) for name in dataset_names]

    def clean_agent(self):
        return self.cleaned_data["agent"].strip()

    def clean_filter(self):
        value = self.cleaned_data["filter"]
        try:
            return clean_filters(value if value not in (None, "") else {})
        except InvalidQuery as exc:
            raise forms.ValidationError(str(exc)) from exc

    def clean(self):
        data = super().clean()
        if not data.get("all_datasets") and not data.get("datasets"):
            self.add_error("datasets", "Choose datasets, or tick “All datasets”.")
        return data

    def scope(self) -> dict:
        data = self.cleaned_data
        return {"datasets": "*" if data["all_datasets"] else sorted(data["datasets"]), "filter": data["filter"]}
