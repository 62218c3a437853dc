"""The "Context length…" form in a real browser: the live plan, refusals, submitting, the
change page following itself, a viewer, and two screen sizes."""

import re

import pytest
from playwright.sync_api import expect

from catalog.models import Change, Model

from .conftest import DESKTOP, PHONE, log_in, no_horizontal_overflow

# serialized_rollback: the seeded GPU classes (a data migration) survive each test's flush.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def open_form(page, live_server, model):
    page.goto(f"{live_server.url}/models/{model.name}/")
    page.click("#context > summary")
    # The form's first preview (on load) says the form is incomplete and disables the button.
    expect(page.locator("#plan")).to_contain_text("Type a context")


def test_typing_a_context_shows_every_profile_and_refuses_one_that_does_not_fit(page, live_server, model, operator, shot):
    page.set_viewport_size(DESKTOP)
    log_in(page, live_server, "operator", "pw-operator-123")
    open_form(page, live_server, model)
    submit = page.locator("#context-submit")
    expect(submit).to_be_disabled()

    # Typed key by key: every keystroke may send a preview; only the last one's answer stays.
    page.locator("#id_tokens").press_sequentially("16384", delay=40)
    plan = page.locator("#plan")
    expect(plan).to_contain_text("8192 → 16384")
    for name in ("cpu", "gguf", "small-card", "vllm"):
        expect(plan.locator(f'[data-profile="{name}"]')).to_be_visible()
    expect(plan.locator('[data-profile="gguf"] .arg.changed')).to_contain_text("32768")
    expect(plan.locator('[data-profile="vllm"] .mem-text').last).to_contain_text("a card of 2, of 71 usable")
    expect(page.locator("#error-tokens")).to_be_empty()
    expect(submit).to_be_enabled()
    shot(page, "plan-fits")

    # Four slots of 32768 tokens: the L4 card cannot hold it.
    page.fill("#id_tokens", "32768")
    page.locator("#id_slots").press_sequentially("4", delay=40)
    small = plan.locator('[data-profile="small-card"]')
    expect(small).to_have_class(re.compile(r"\brefused\b"))
    expect(small).to_contain_text("does not fit")
    expect(page.locator("#error-tokens")).to_contain_text("with 32768 tokens the small-card profile needs")
    expect(page.locator("#error-tokens")).to_contain_text("L4 cards")
    expect(submit).to_be_disabled()
    expect(plan.locator('[data-profile="gguf"]')).not_to_have_class(re.compile(r"\brefused\b"))
    shot(page, "plan-refused")

    # Bad input: a clear message, nothing written.
    page.fill("#id_slots", "-3")
    expect(page.locator("#error-slots")).to_have_text("Enter 0 or more.")
    expect(page.locator("#error-tokens")).to_be_empty()
    expect(submit).to_be_disabled()
    assert Change.objects.count() == 0


def test_submit_follows_the_change_until_it_ends(page, live_server, model, operator, shot, enqueued):
    page.set_viewport_size(DESKTOP)
    log_in(page, live_server, "operator", "pw-operator-123")
    open_form(page, live_server, model)
    page.fill("#id_tokens", "16384")
    page.fill("#id_message", "longer documents")
    submit = page.locator("#context-submit")
    expect(submit).to_be_enabled()
    expect(page.locator("#plan")).to_contain_text("8192 → 16384")
    submit.click()
    page.wait_for_url(re.compile(r"/changes/\d+/$"))
    change = Change.objects.get()
    assert (change.state, change.source, change.message) == ("queued", "console", "longer documents")
    expect(page.locator("#change-state")).to_have_text("Queued")
    shot(page, "change-queued")

    # The page polls itself every second; the worker (here, the test) moves the change on.
    Change.objects.filter(pk=change.pk).update(state="running")
    expect(page.locator("#change-state")).to_have_text("Running", timeout=5000)
    Change.objects.filter(pk=change.pk).update(state="succeeded")
    expect(page.locator("#change-state")).to_have_text("Succeeded", timeout=5000)
    # Ended: the server answered 286 and the polling stopped.
    polls = []
    page.on("request", lambda r: polls.append(r.url) if f"/changes/{change.pk}/" in r.url else None)
    page.wait_for_timeout(2500)
    assert polls == []
    shot(page, "change-succeeded")


def test_a_max_output_only_change_restarts_nothing(page, live_server, model, operator, shot, enqueued):
    page.set_viewport_size(DESKTOP)
    log_in(page, live_server, "operator", "pw-operator-123")
    open_form(page, live_server, model)
    page.fill("#id_max_output", "4096")
    plan = page.locator("#plan")
    expect(plan).to_contain_text("Only the longest answer changes")
    expect(plan).to_contain_text("2048 → 4096")
    submit = page.locator("#context-submit")
    expect(submit).to_have_text("Change the longest answer")
    shot(page, "max-output-plan")
    submit.click()
    page.wait_for_url(re.compile(r"/changes/\d+/$"))
    expect(page.locator("#change-state")).to_have_text("Succeeded")
    expect(page.locator("#change-live")).to_contain_text("nothing restarted")
    assert enqueued == []
    assert Model.objects.get(pk=model.pk).max_output == 4096
    shot(page, "max-output-done")


def test_a_viewer_sees_the_plan_but_cannot_submit(page, live_server, model, viewer, shot):
    page.set_viewport_size(DESKTOP)
    log_in(page, live_server, "viewer", "pw-viewer-123")
    open_form(page, live_server, model)
    page.fill("#id_tokens", "16384")
    expect(page.locator("#plan")).to_contain_text("8192 → 16384")
    expect(page.locator('#plan [data-profile="gguf"]')).to_be_visible()
    expect(page.locator("#context-submit")).to_have_count(0)
    expect(page.locator("#no-permission")).to_be_visible()
    shot(page, "viewer-plan")
    # A POST made anyway, with the session and its CSRF token: refused, nothing written.
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(
        f"{live_server.url}/models/{model.name}/context/",
        form={"tokens": "16384"},
        headers={"X-CSRFToken": token, "Referer": page.url},
    )
    assert response.status == 403 and "Not allowed" in response.text()
    assert Change.objects.count() == 0


def test_without_javascript_the_form_still_posts(browser, live_server, model, operator, shot, enqueued):
    context = browser.new_context(java_script_enabled=False, viewport=DESKTOP)
    page = context.new_page()
    log_in(page, live_server, "operator", "pw-operator-123")
    page.goto(f"{live_server.url}/models/{model.name}/")
    page.click("#context > summary")
    page.fill("#id_tokens", "500000")
    page.click("#context-submit")
    expect(page.locator("#error-tokens")).to_contain_text("trained for 32768 tokens")
    expect(page.locator("#id_tokens")).to_have_value("500000")
    shot(page, "nojs-refused")
    page.fill("#id_tokens", "16384")
    page.click("#context-submit")
    page.wait_for_url(re.compile(r"/changes/\d+/$"))
    expect(page.locator("#change-state")).to_have_text("Queued")
    assert Model.objects.get(pk=model.pk).context_length == 16384
    context.close()


@pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["1280x800", "390x844"])
def test_pages_fit_the_screen(page, live_server, model, operator, shot, size, enqueued):
    page.set_viewport_size(size)
    tag = f"{size['width']}x{size['height']}"
    page.goto(f"{live_server.url}/models/{model.name}/")  # anonymous: sent to log in first
    expect(page.locator("h1")).to_have_text("Log in")
    assert no_horizontal_overflow(page), "login"
    shot(page, f"login-{tag}")
    log_in(page, live_server, "operator", "pw-operator-123")
    assert no_horizontal_overflow(page), "model list"
    shot(page, f"models-{tag}")

    open_form(page, live_server, model)
    page.fill("#id_tokens", "32768")
    page.fill("#id_slots", "4")
    expect(page.locator('#plan [data-profile="small-card"]')).to_contain_text("does not fit")
    assert no_horizontal_overflow(page), "model page with a plan"
    shot(page, f"model-{tag}")
    shot(page, f"model-{tag}-form", element="#context")

    page.fill("#id_slots", "")
    page.fill("#id_tokens", "16384")
    expect(page.locator("#context-submit")).to_be_enabled()
    page.click("#context-submit")
    page.wait_for_url(re.compile(r"/changes/\d+/$"))
    assert no_horizontal_overflow(page), "change page"
    shot(page, f"change-{tag}")

    page.goto(f"{live_server.url}/changes/")
    assert no_horizontal_overflow(page), "history"
    shot(page, f"history-{tag}")


def test_a_slow_answer_never_replaces_a_newer_one(page, live_server, model, operator):
    """hx-sync="this:replace": a preview still on its way when the admin types on is
    dropped; only the answer to what is in the form now is shown."""
    held = []

    def hold_the_first(route):
        if "tokens=12288" in (route.request.post_data or ""):
            held.append(route)  # answered only after the newer one
        else:
            route.continue_()

    page.set_viewport_size(DESKTOP)
    log_in(page, live_server, "operator", "pw-operator-123")
    page.route("**/context/preview/", hold_the_first)
    open_form(page, live_server, model)
    page.fill("#id_tokens", "12288")
    page.wait_for_timeout(600)  # past the 300 ms debounce: that preview is on its way, and held
    assert len(held) == 1
    page.fill("#id_tokens", "16384")
    plan = page.locator("#plan")
    expect(plan).to_contain_text("8192 → 16384")
    try:
        held[0].continue_()  # the stale answer comes back late (if the browser still waits for it)
    except Exception:  # noqa: BLE001 - htmx aborted it: nothing to answer
        pass
    page.wait_for_timeout(1000)
    expect(plan).to_contain_text("8192 → 16384")
    expect(plan).not_to_contain_text("12288")
