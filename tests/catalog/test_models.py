"""The catalog's constraints live in the database, and migrations match the models."""

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction

from catalog.models import Change, GPUClass, Model, Profile


def test_migrations_match_the_models(db):
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "make",
    [
        lambda m: Model.objects.create(name=m.name),
        lambda m: Profile.objects.create(model=m, name="p", engine="llamacpp") and Profile.objects.create(model=m, name="p", engine="vllm"),
        lambda m: Profile.objects.create(model=m, name="q", engine="tgi"),
        lambda m: Profile.objects.create(model=m, name="r", engine="vllm", tp=0),
        lambda m: GPUClass.objects.create(name="X", memory_gb=10, usable_gb=11, source="x"),
        lambda m: GPUClass.objects.create(name="Y", memory_gb=-1, usable_gb=-2, source="x"),
        lambda m: [Change.objects.create(model=m, kind="context", source="api", state=s) for s in ("queued", "running")],
    ],
    ids=["unique model name", "unique profile name", "engine choices", "tp positive", "usable within memory",
         "sizes non-negative", "one active change per model"],
)
def test_database_constraints(make):
    model = Model.objects.create(name="m")
    with pytest.raises(IntegrityError), transaction.atomic():
        make(model)
