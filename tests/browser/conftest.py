"""Browser tests: Debian's Chromium driven by Playwright, against pytest-django's live server.

Never `playwright install` (its download host is unreachable here): the launch uses
/usr/bin/chromium (`apt-get install -y chromium`)."""

import os
import shutil
from pathlib import Path

import pytest

from catalog.models import GPUClass, Profile
from tests.builders import make_model, use_shape

# Playwright's sync API runs an event loop in this thread; the ORM calls made from the
# test itself are still synchronous and safe.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/browser/" in str(item.fspath):
            item.add_marker(pytest.mark.browser)
            if shutil.which(CHROMIUM) is None:
                item.add_marker(pytest.mark.skip(reason=f"no {CHROMIUM}: apt-get install -y chromium"))


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "args": [
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-quic",
        ],
    }


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def model(monkeypatch, enqueued):
    """llama-8b (a Llama-like 8B shape, no network) served by llama.cpp on an A100-80G, vLLM
    on two, llama.cpp on CPUs, and llama.cpp on one L4 (24 GB: too small for long contexts)."""
    use_shape(monkeypatch)
    model = make_model()
    Profile.objects.create(
        model=model, name="small-card", engine="llamacpp", args=["--ctx-size", "8192", "--parallel", "1"],
        gpu_class=GPUClass.objects.get(name="L4"), gpus_per_node=1,
    )
    return model


@pytest.fixture
def shot(output_path):
    """Save a full-page screenshot under the run's output folder (--output, default test-results/)."""
    folder = Path(output_path)
    folder.mkdir(parents=True, exist_ok=True)

    def take(page, name: str, element: str = "") -> Path:
        """The whole page, or one element of it (readable at full size on a phone's width)."""
        path = folder / f"{name}.png"
        if element:
            page.locator(element).screenshot(path=str(path))
        else:
            page.screenshot(path=str(path), full_page=True)
        return path

    return take


def log_in(page, live_server, username: str, password: str):
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")


def no_horizontal_overflow(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
