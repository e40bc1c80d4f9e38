"""Consent walls: optionally answered before an episode's first screenshot (``WorkerConfig.consent``).

Many live sites open with a cookie-consent dialog of one of a few consent managers. Answering it changes what the
model sees, so it is off by default (the model then sees the wall as a person would and may answer it itself);
``"reject"`` or ``"accept"`` clicks that button of a known consent manager on the start page, once, and the
episode's ``open_events`` say so (a ``consent`` event naming the button).
"""

from __future__ import annotations

import json
from typing import Literal, get_args

ConsentMode = Literal["off", "reject", "accept"]
CONSENT_MODES: tuple[ConsentMode, ...] = get_args(ConsentMode)

# (consent manager, reject button, accept button): CSS selectors of their standard markup.
CONSENT_BUTTONS: tuple[tuple[str, str, str], ...] = (
    ("OneTrust", "#onetrust-reject-all-handler", "#onetrust-accept-btn-handler"),
    ("Cookiebot", "#CybotCookiebotDialogBodyButtonDecline", "#CybotCookiebotDialogBodyLevelButtonLevelOptinAllowAll"),
    ("Didomi", "#didomi-notice-disagree-button", "#didomi-notice-agree-button"),
    ("Quantcast", ".qc-cmp2-summary-buttons button[mode='secondary']",
     ".qc-cmp2-summary-buttons button[mode='primary']"),
    ("Usercentrics", "[data-testid='uc-deny-all-button']", "[data-testid='uc-accept-all-button']"),
    ("TrustArc", "#truste-consent-required", "#truste-consent-button"),
    ("Osano", ".osano-cm-denyAll", ".osano-cm-accept-all"),
    ("Complianz", ".cmplz-deny", ".cmplz-accept"),
)


def consent_script(mode: str) -> str:
    """A page expression that clicks the first visible ``mode`` button of a known consent manager; it returns
    ``"Manager: selector"`` when it clicked one, else null."""
    if mode not in ("reject", "accept"):
        raise ValueError(f"consent must be one of {CONSENT_MODES}, not {mode!r}")
    column = 1 if mode == "reject" else 2
    pairs = [[row[0], row[column]] for row in CONSENT_BUTTONS]
    return ("(() => { for (const [name, sel] of " + json.dumps(pairs) + ") {"
            " const el = document.querySelector(sel);"
            " if (el && el.getClientRects().length) { el.click(); return name + ': ' + sel; } }"
            " return null; })()")
