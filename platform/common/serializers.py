"""Serializers of JSON request bodies take each value as sent, at the JSON type the OpenAPI document gives it.

DRF converts for HTML forms' sake: `0` becomes `"0"` in a CharField, `"1"` and `1` become `true` in
a BooleanField, `"5"` becomes `5` in an IntegerField, `""` becomes null in a relation, and text is
trimmed before it is checked (so `" abc"` passes a pattern that refuses it, and a value of 101
characters passes a limit of 100). A JSON client that sends something else than the documented
value has a bug, and the API says so (400 naming the field) instead of guessing. Query strings
are text by nature: serializers of query parameters stay plain DRF serializers.
"""
import re
import sys

from django.core.validators import RegexValidator
from rest_framework import serializers

# Most specific first: ChoiceField and the relations before the types they could be mistaken for.
JSON_TYPES: list[tuple[type, tuple[type, ...], str]] = [
    (serializers.BooleanField, (bool,), "a boolean"),
    (serializers.ChoiceField, (str,), "a string"),
    (serializers.CharField, (str,), "a string"),
    (serializers.SlugRelatedField, (str,), "a string"),
    (serializers.IntegerField, (int,), "an integer"),
    (serializers.FloatField, (int, float), "a number"),
]


def _space_class() -> str:
    """What str.strip() removes, as the ranges of a regex character class, in the \\uXXXX form that
    Python and the JSON Schema dialects read alike."""
    codes = [code for code in range(sys.maxunicode + 1) if chr(code).isspace()]
    ranges, start = [], codes[0]
    for previous, code in zip(codes, [*codes[1:], None], strict=True):
        if code != previous + 1:
            ranges.append(f"\\u{start:04x}" + (f"-\\u{previous:04x}" if previous != start else ""))
            start = code
    return "".join(ranges)


NOT_ONLY_SPACE = f"[^{_space_class()}]"  # some character that is not white space
not_blank = RegexValidator(re.compile(NOT_ONLY_SPACE), message="This field may not be blank.")


def json_type_error(field: serializers.Field, value) -> str | None:
    """Why `value` is not of the field's JSON type, or None when it is (or the field takes any)."""
    if value is None:
        return None  # the field's own allow_null decides
    if isinstance(field, serializers.ManyRelatedField | serializers.ListField):
        if not isinstance(value, list):
            return "Must be a list."
        child = field.child_relation if isinstance(field, serializers.ManyRelatedField) else field.child
        return next(filter(None, (json_type_error(child, item) for item in value)), None)
    if isinstance(field, serializers.RelatedField) and value == "":
        return "This field may not be blank."  # DRF would read it as null
    for field_class, types, name in JSON_TYPES:
        if isinstance(field, field_class):
            if isinstance(value, bool) and bool not in types or not isinstance(value, types):
                return f"Must be {name}."
            return None
    return None


def take_text_as_sent(field: serializers.Field) -> None:
    for text in (field, getattr(field, "child", None)):
        if isinstance(text, serializers.CharField) and text.trim_whitespace:
            text.trim_whitespace = False
            if not text.allow_blank:
                text.validators.append(not_blank)


class StrictTypesMixin:
    def get_fields(self):
        fields = super().get_fields()
        for field in fields.values():
            if not field.read_only:
                take_text_as_sent(field)
        return fields

    def to_internal_value(self, data):
        if isinstance(data, dict) and not hasattr(data, "getlist"):  # a JSON object, not a query string
            errors = {}
            for field in self._writable_fields:
                if field.field_name in data:
                    problem = json_type_error(field, data[field.field_name])
                    if problem:
                        errors[field.field_name] = [problem]
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


# No docstrings: the OpenAPI document would describe every subclass with them.
class Serializer(StrictTypesMixin, serializers.Serializer):
    pass


class ModelSerializer(StrictTypesMixin, serializers.ModelSerializer):
    pass
