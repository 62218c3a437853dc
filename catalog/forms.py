"""The console's forms: they parse what was typed, and nothing more.

Every rule about what a context change may be (at least 256 tokens, within the trained
context, fitting the cards…) is the services' (`catalog.services`, deciding through
`catalog.domain.plan`): a form only turns text into whole numbers, so that a preview or a
change receives integers, and says so in words when it cannot."""

from __future__ import annotations

from django import forms
from django.contrib.auth import get_user_model

from .choices import ChangeState, Source
from .models import Model

# Larger than any context an engine takes (the plan refuses past 2**31 - 1 with its own
# message); this only keeps absurd input out of arithmetic and out of the audit record.
LARGEST = 10**12

WHOLE_NUMBER = "Enter a whole number of tokens."
NOT_NEGATIVE = "Enter 0 or more."
TOO_LARGE = "That number is too large."


def _number(label: str, placeholder: str, help_text: str) -> forms.IntegerField:
    return forms.IntegerField(
        label=label,
        required=False,
        min_value=0,
        max_value=LARGEST,
        help_text=help_text,
        error_messages={"invalid": WHOLE_NUMBER, "min_value": NOT_NEGATIVE, "max_value": TOO_LARGE},
        widget=forms.NumberInput(attrs={"placeholder": placeholder, "inputmode": "numeric", "autocomplete": "off"}),
    )


class ContextForm(forms.Form):
    """'Context length…': tokens, slots, longest answer, and why."""

    tokens = _number("Context", "tokens", "tokens one request may use")
    slots = _number("Slots", "keep", "llama.cpp: requests at once (empty keeps each profile's)")
    max_output = _number("Longest answer", "tokens", "empty: follows the context; alone: changes only the cap")
    message = forms.CharField(
        label="Why",
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "what this change is for (kept in the history)"}),
    )

    FIELDS = ("tokens", "slots", "max_output", "message")

    def __init__(self, *args, model: Model | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if model is not None:
            self.fields["tokens"].widget.attrs["placeholder"] = str(model.context_length or "tokens")
            self.fields["max_output"].widget.attrs["placeholder"] = str(model.max_output or "no limit")

    def clean(self):
        data = super().clean()
        if not self.errors and not data.get("tokens") and not data.get("max_output"):
            raise forms.ValidationError(
                "Enter a context in tokens, or a longest answer alone.", code="incomplete"
            )
        return data

    @property
    def incomplete(self) -> bool:
        """Nothing asked for yet: not an error worth a red message while the admin types."""
        return self.is_bound and any(e.code == "incomplete" for e in self.non_field_errors().as_data())

    def request_kwargs(self) -> dict:
        """The cleaned numbers as the services take them (0 = not given)."""
        return {name: self.cleaned_data.get(name) or 0 for name in ("tokens", "slots", "max_output")}


class HistoryFilterForm(forms.Form):
    """The audit history's filters, read from GET parameters; an unknown value is ignored."""

    model = forms.ChoiceField(required=False)
    user = forms.ChoiceField(required=False)
    source = forms.ChoiceField(required=False, choices=[("", "any source"), *Source.choices])
    state = forms.ChoiceField(required=False, choices=[("", "any state"), *ChangeState.choices])

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        names = Model.objects.order_by("name").values_list("name", flat=True)
        self.fields["model"].choices = [("", "any model"), *((n, n) for n in names)]
        usernames = get_user_model().objects.order_by("username").values_list("username", flat=True)
        self.fields["user"].choices = [("", "anyone"), *((u, u) for u in usernames)]

    def filters(self) -> dict:
        """Queryset filters for the valid, non-empty fields: a stale link with one unknown
        value still filters by the others (an invalid field is left out of cleaned_data)."""
        self.is_valid()
        lookups = {"model": "model__name", "user": "user__username", "source": "source", "state": "state"}
        return {lookups[k]: v for k, v in self.cleaned_data.items() if v}
