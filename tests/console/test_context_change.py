"""Submitting "Context length…": the services make the change; the console redirects to it,
or shows why not (with and without htmx)."""

import re
from html import unescape

import pytest
from django.test import Client
from django.urls import reverse

from catalog.models import Change, Model

from .conftest import HX

pytestmark = pytest.mark.django_db


def submit(client, model, htmx=False, **data):
    return client.post(reverse("catalog:context_change", args=[model.name]), data, **(HX if htmx else {}))


def error_of(html: str, field: str) -> str:
    return unescape(re.search(rf'<span class="field-error" id="error-{field}">(.*?)</span>', html, re.S).group(1))


def test_submit_makes_the_change_and_goes_to_its_page(operator_client, model, operator, enqueued):
    response = submit(operator_client, model, tokens="16384", slots="4", message="longer documents")
    change = Change.objects.get()
    assert response.status_code == 302 and response["Location"] == change.get_absolute_url()
    assert (change.state, change.source, change.user, change.message) == ("queued", "console", operator, "longer documents")
    assert Model.objects.get(pk=model.pk).context_length == 16384
    page = operator_client.get(response["Location"]).content.decode()
    assert "Queued" in page and "longer documents" in page and 'hx-trigger="every 1s"' in page


def test_with_htmx_the_browser_is_told_where_to_go(operator_client, model, enqueued):
    response = submit(operator_client, model, htmx=True, tokens="16384")
    change = Change.objects.get()
    assert response.status_code == 200 and response["HX-Redirect"] == change.get_absolute_url()


def test_a_max_output_only_change_is_done_at_once_and_restarts_nothing(operator_client, model, enqueued):
    response = submit(operator_client, model, max_output="4096", message="longer answers")
    change = Change.objects.get()
    assert (change.kind, change.state) == ("max_output", "succeeded")
    assert enqueued == []
    page = operator_client.get(response["Location"]).content.decode()
    assert "Succeeded" in page and "nothing restarted" in page
    assert "hx-trigger" not in page  # done: nothing to poll


def test_a_refused_change_re_renders_the_page_with_the_plan_and_the_error(operator_client, model, enqueued):
    response = submit(operator_client, model, tokens="500000", message="too long")
    html = response.content.decode()
    assert response.status_code == 200 and "<html" in html  # without JavaScript: the whole page
    assert "trained for 32768 tokens" in error_of(html, "tokens")
    assert 'value="500000"' in html and "too long" in html  # what was typed stays
    assert "<details id=\"context\" class=\"card\" open>" in html
    assert Model.objects.get(pk=model.pk).context_length == 8192
    assert not Change.objects.exclude(state="refused").exists() and enqueued == []


def test_bad_input_without_javascript_shows_the_field_error(operator_client, model):
    html = submit(operator_client, model, tokens="abc").content.decode()
    assert "Enter a whole number of tokens." in error_of(html, "tokens")
    html = submit(operator_client, model).content.decode()
    assert "Enter a context in tokens, or a longest answer alone." in error_of(html, "form")
    assert Change.objects.count() == 0


def test_a_refused_change_with_htmx_answers_the_form_panel(operator_client, model):
    response = submit(operator_client, model, htmx=True, tokens="100")
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert html.lstrip().startswith('<div id="context-panel">')
    assert "a context of at least 256 tokens" in error_of(html, "tokens")


def test_a_second_change_while_one_runs_shows_the_running_one(operator_client, model, enqueued):
    first = submit(operator_client, model, tokens="16384")
    running = Change.objects.get()
    html = submit(operator_client, model, tokens="12288").content.decode()
    assert f'href="{running.get_absolute_url()}"' in html
    assert f"change {running.pk} of llama-8b is queued" in error_of(html, "form")
    assert Change.objects.count() == 1 and first.status_code == 302


def test_a_viewer_is_refused(viewer_client, model):
    response = submit(viewer_client, model, tokens="16384")
    assert response.status_code == 403 and b"change_context" in response.content
    assert Change.objects.count() == 0 and Model.objects.get(pk=model.pk).context_length == 8192


def test_csrf_is_enforced(operator, model, enqueued):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert submit(client, model, tokens="16384").status_code == 403
    assert Change.objects.count() == 0
    page = client.get(reverse("catalog:model_detail", args=[model.name])).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    assert submit(client, model, tokens="16384", csrfmiddlewaretoken=token).status_code == 302
    assert Change.objects.count() == 1
