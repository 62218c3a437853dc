"""A test database other processes can open (a Celery worker in test_rollout.py): a file
for SQLite instead of memory; PostgreSQL's test database already is one.

Used by tests/console and tests/browser (whichever runs first creates the database for
the session, so both must ask for the same kind)."""

import pytest
from django.conf import settings


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, tmp_path_factory):
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        db.setdefault("TEST", {})["NAME"] = str(tmp_path_factory.mktemp("consoledb") / "test.sqlite3")
