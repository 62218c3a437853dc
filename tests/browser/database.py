"""A test database other processes can open (a Celery worker in test_rollout.py): a file
for SQLite instead of memory; for PostgreSQL a name of this run's own, so that two runs on
one server do not drop each other's database.

Used by tests/console and tests/browser (whichever runs first creates the database for
the session, so both must ask for the same kind)."""

import os

import pytest
from django.conf import settings


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, tmp_path_factory):
    db = settings.DATABASES["default"]
    test = db.setdefault("TEST", {})
    if db["ENGINE"].endswith("sqlite3"):
        test["NAME"] = str(tmp_path_factory.mktemp("consoledb") / "test.sqlite3")
    elif not test.get("NAME"):
        test["NAME"] = f"test_{db['NAME']}_console_{os.getpid()}"
