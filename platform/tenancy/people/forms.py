"""Forms of the people pages: what each field takes is said before anything is sent."""
import zoneinfo

from django import forms
from django.contrib.auth.password_validation import password_validators_help_texts

from tenancy.models import Role
from tenancy.web import TenantForm

ROLE_HELP = {
    Role.ADMIN: "everything, including members, API keys and settings",
    Role.OPERATOR: "tools, groups, bindings, rules and queues; reviews too",
    Role.REVIEWER: "decides approval requests",
    Role.VIEWER: "reads, changes nothing",
}
ROLE_CHOICES = [(role.value, f"{role.label} — {ROLE_HELP[role]}") for role in Role]


class InviteForm(TenantForm):
    email = forms.EmailField(max_length=254, help_text="The invitation's link goes to this address.")
    role = forms.ChoiceField(choices=ROLE_CHOICES, initial=Role.REVIEWER)


class RoleForm(TenantForm):
    role = forms.ChoiceField(choices=Role.choices, widget=forms.Select(attrs={"aria-label": "Role"}))

    def initial_for(self, membership) -> dict:
        return {"role": membership.role}


def _zone_choices():
    return [("", "UTC (the server's)"), *((name, name) for name in sorted(zoneinfo.available_timezones()))]


class ProfileForm(forms.Form):
    name = forms.CharField(max_length=150, required=False, help_text="How other members see you.")
    email = forms.EmailField(max_length=254, required=False,
                             help_text="Where approval requests' email notifications reach you.")
    time_zone = forms.ChoiceField(choices=_zone_choices, required=False,
                                  help_text="Every time in the console is shown in this zone.")


class AccountForm(forms.Form):
    """A new account for someone accepting an invitation."""

    username = forms.CharField(max_length=150, help_text="Letters, digits and @ . + - _ only; 150 at most.")
    password = forms.CharField(widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
                               help_text=" ".join(password_validators_help_texts()))
