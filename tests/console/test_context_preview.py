"""The live preview of a context change (Healthchecks' cron_preview, one for one): a POST
with the form, the services compute, a fragment says what would happen or why not, always
200, nothing written."""

import json
import re
from html import unescape

import pytest
from django.test import Client
from django.urls import reverse

from catalog.models import Change, GPUClass, Model, Profile

from .conftest import HX

pytestmark = pytest.mark.django_db


def submit_usable(response) -> bool:
    """What the preview tells the page's submit button (an htmx event after the swap):
    usable only while the plan is complete and accepted."""
    event = json.loads(response["HX-Trigger-After-Swap"])["plan-checked"]
    return event["ok"]


def error_of(html: str, field: str) -> str:
    """The message shown on a field (swapped in out of band), as text."""
    span = re.search(rf'<span class="field-error" id="error-{field}" hx-swap-oob="true">(.*?)</span>', html, re.S)
    return unescape(span.group(1))


def preview(client, model, **data):
    return client.post(reverse("catalog:context_preview", args=[model.name]), data, **HX)


def unchanged(model):
    fresh = Model.objects.get(pk=model.pk)
    return (
        Change.objects.count() == 0
        and (fresh.context_length, fresh.max_output) == (model.context_length, model.max_output)
        and {p.name: p.args for p in fresh.profiles.all()} == {p.name: p.args for p in model.profiles.all()}
    )


def test_every_profile_has_its_plan(operator_client, model):
    response = preview(operator_client, model, tokens="16384", slots="4")
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    for name in ("gguf", "vllm", "cpu"):
        assert f'data-profile="{name}"' in html
    # The argument diff: changed flags highlighted with their old and new values.
    assert '<span class="arg changed">--ctx-size <del title="before">16384</del><ins title="after">65536</ins></span>' in html
    assert '<span class="arg changed">--max-model-len=<del title="before">8192</del><ins title="after">16384</ins></span>' in html
    # Memory before and after, against the card.
    assert "a card of 2, of 71 usable" in html and 'class="mem-usable"' in html
    assert "GB of RAM" in html  # the CPU profile
    assert "new before old" in html  # the restart policy
    assert "8192 → <strong>16384</strong>" in html
    assert submit_usable(response) is True
    assert 'id="context-submit"' not in html  # the button is the page's, outside the fragment
    assert unchanged(model)


def test_a_gpu_profile_that_does_not_fit_is_refused_inline(operator_client, model):
    Profile.objects.create(model=model, name="small", engine="llamacpp", args=["--ctx-size", "8192"],
                           gpu_class=GPUClass.objects.get(name="L4"), gpus_per_node=1)
    response = preview(operator_client, model, tokens="32768", slots="4")
    html = response.content.decode()
    small = html.split('data-profile="small"')[1].split("</article>")[0]
    assert "with 32768 tokens the small profile needs" in small and "L4 cards" in small
    assert 'class="mem-row over"' in small and "does not fit" in small
    # The refusal sits on the field it concerns, swapped in out of band.
    assert "the small profile needs" in error_of(html, "tokens")
    assert error_of(html, "slots") == ""  # a stale error is cleared
    assert submit_usable(response) is False
    assert unchanged(model)


@pytest.mark.parametrize(
    "data, field, message",
    [
        ({"tokens": "lots"}, "tokens", "Enter a whole number of tokens."),
        ({"tokens": "16384.5"}, "tokens", "Enter a whole number of tokens."),
        ({"tokens": "-1"}, "tokens", "Enter 0 or more."),
        ({"tokens": "16384", "slots": "-2"}, "slots", "Enter 0 or more."),
        ({"max_output": "1e9999"}, "max_output", "Enter a whole number of tokens."),
        ({"tokens": "9" * 40}, "tokens", "That number is too large."),
        ({"tokens": "100"}, "tokens", "a context of at least 256 tokens"),  # the plan's own rule
        ({"tokens": "16384", "max_output": "20000"}, "max_output", "an answer of 20000 tokens does not fit"),
        ({"tokens": "16384", "slots": "65"}, "slots", "slots are 1 to 64"),
    ],
)
def test_bad_input_is_a_clear_message_and_writes_nothing(operator_client, model, data, field, message):
    response = preview(operator_client, model, **data)
    assert response.status_code == 200
    html = response.content.decode()
    assert message in error_of(html, field)
    assert "→ <strong>" not in html  # no before → after for what was refused before any plan
    assert submit_usable(response) is False
    assert unchanged(model)


def test_an_empty_form_is_incomplete_not_an_error(operator_client, model):
    for data in ({}, {"tokens": "", "slots": "", "max_output": "", "message": "why"}):
        response = preview(operator_client, model, **data)
        html = response.content.decode()
        assert response.status_code == 200
        assert "Type a context" in html
        assert error_of(html, "form") == ""
        assert submit_usable(response) is False
    assert unchanged(model)


def test_a_max_output_only_preview_says_nothing_restarts(operator_client, model):
    response = preview(operator_client, model, max_output="4096")
    html = response.content.decode()
    assert "Only the longest answer changes" in html and "nothing restarts" in html
    assert "2048 → <strong>4096</strong>" in html
    assert json.loads(response["HX-Trigger-After-Swap"])["plan-checked"] == {
        "ok": True, "label": "Change the longest answer"}
    assert 'class="arg changed"' not in html
    assert unchanged(model)


def test_a_viewer_sees_the_plan_without_a_submit_button(viewer_client, model):
    html = preview(viewer_client, model, tokens="16384").content.decode()
    assert 'data-profile="gguf"' in html and "8192 → <strong>16384</strong>" in html
    page = viewer_client.get(reverse("catalog:model_detail", args=[model.name])).content.decode()
    assert 'id="context-submit"' not in page and 'id="context-form"' in page
    assert 'id="no-permission"' in page and "change_context" in page


def test_a_declared_model_is_refused_with_the_seeds_message(operator_client, model):
    Model.objects.filter(pk=model.pk).update(declared=True)
    html = preview(operator_client, model, tokens="16384").content.decode()
    assert "is declared in the cluster's settings: change its context there" in error_of(html, "form")
    assert unchanged(model)


def test_the_preview_is_the_same_fragment_with_or_without_htmx(operator_client, model):
    url = reverse("catalog:context_preview", args=[model.name])
    plain = operator_client.post(url, {"tokens": "16384"})
    htmx = operator_client.post(url, {"tokens": "16384"}, **HX)
    assert plain.status_code == htmx.status_code == 200
    assert plain.content == htmx.content and b"<html" not in plain.content


def test_unknown_model_is_404(operator_client):
    response = operator_client.post(reverse("catalog:context_preview", args=["nope"]), {"tokens": "16384"}, **HX)
    assert response.status_code == 404


def test_csrf_is_enforced(operator, model):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    url = reverse("catalog:context_preview", args=[model.name])
    assert client.post(url, {"tokens": "16384"}, **HX).status_code == 403
    page = client.get(reverse("catalog:model_detail", args=[model.name]))
    token = page.cookies["csrftoken"].value
    # htmx sends the token in a header (set once on <body>).
    assert 'hx-headers=\'{"X-CSRFToken": "' in page.content.decode()
    ok = client.post(url, {"tokens": "16384"}, HTTP_X_CSRFTOKEN=token, **HX)
    assert ok.status_code == 200 and b'data-profile="gguf"' in ok.content


def test_get_is_not_allowed(operator_client, model):
    assert operator_client.get(reverse("catalog:context_preview", args=[model.name])).status_code == 405


def test_the_preview_costs_no_query_beyond_the_services(operator_client, model, django_assert_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from catalog import plan_inputs, services

    with CaptureQueriesContext(connection) as service:
        services.preview(model.name, tokens=16384)
    assert service.captured_queries  # the model, its profiles and classes, the fleet's room
    plan_inputs.clear()
    with django_assert_num_queries(2 + len(service.captured_queries)):  # the session and its user
        preview(operator_client, model, tokens="16384")
    # While the catalog does not change, the next keystrokes plan from what was read.
    with django_assert_num_queries(2):
        preview(operator_client, model, tokens="32768")


def test_what_admins_typed_is_escaped_in_the_plan(operator_client, operator, model):
    """Profile names and arguments reach the plan's HTML (built in Python, not a template)
    escaped: a profile or an argument that looks like markup shows as text."""
    gguf = model.profiles.get(name="gguf")
    gguf.name = '<b onmouseover="x">gguf</b>'
    gguf.args = [*gguf.args, "--alias", "<script>alert(1)</script>"]
    gguf.save()
    html = preview(operator_client, model, tokens="16384").content.decode()
    assert "<script>" not in html and "<b onmouseover" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'data-profile="&lt;b onmouseover=&quot;x&quot;&gt;gguf&lt;/b&gt;"' in html

    # The change page draws the same cards from the change's record.
    from catalog import services

    change = services.request_change(model.name, tokens=16384, user=operator, source="console")
    page = operator_client.get(change.get_absolute_url()).content.decode()
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
