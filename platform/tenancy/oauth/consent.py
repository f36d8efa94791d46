"""The authorization request between the authorization endpoint and the consent page: signed and dated, so the
page shows and grants exactly what the endpoint validated, for ten minutes, and keeps nothing meanwhile. It holds
nothing secret (the client sent all of it in the URL)."""
from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta
from urllib.parse import urlencode

from django.core import signing
from django.urls import reverse

from tenancy.oauth.services import Consent
from tenancy.selectors import issuer

CONSENT_SALT = "tenancy.oauth.consent"
CONSENT_MAX_AGE = timedelta(minutes=10)


def consent_url(consent: Consent) -> str:
    signed = signing.dumps(asdict(consent), salt=CONSENT_SALT, compress=True)
    return f"{issuer()}{reverse('oauth_consent')}?{urlencode({'request': signed})}"


def consent_from(signed: str) -> Consent | None:
    """The request a consent page's link carries, or None for one that was changed or is too old."""
    try:
        values = signing.loads(signed or "", salt=CONSENT_SALT, max_age=CONSENT_MAX_AGE)
        return Consent(**{**values, "scopes": tuple(values["scopes"])})
    except (signing.BadSignature, TypeError, KeyError, ValueError):
        return None
