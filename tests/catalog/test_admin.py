"""Django admin: every model's pages load for staff, none for an anonymous visitor;
declared models and the change history are read-only."""

import pytest
from django.contrib import admin
from django.urls import reverse

from catalog.models import Change, GPUClass, Model, Node, OriginFile, Profile, Replica


@pytest.fixture
def catalog_rows(db):
    l4 = GPUClass.objects.get(name="L4")
    model = Model.objects.create(name="m1", source="m1.gguf", context_length=4096)
    OriginFile.objects.create(model=model, path="m1.gguf", size=10)
    profile = Profile.objects.create(model=model, name="gpu", engine="llamacpp", gpu_class=l4, gpus_per_node=1,
                                     args=["--ctx-size", "4096", "--parallel", "1"])
    node = Node.objects.create(name="n1", gpu_class=l4, gpu_count=1)
    replica = Replica.objects.create(profile=profile, node=node, state="ready", endpoint="http://127.0.0.1:1")
    change = Change.objects.create(model=model, kind="context", source="api", state="succeeded")
    declared = Model.objects.create(name="decl", declared=True, origin_repo="org/x")
    Profile.objects.create(model=declared, name="v", engine="vllm", gpu_class=l4, args=["--max-model-len", "8"])
    return {"gpuclass": l4, "model": model, "originfile": OriginFile.objects.first(), "profile": profile,
            "node": node, "replica": replica, "change": change, "declared": declared}


def admin_urls(rows):
    for model_class in admin.site._registry:
        meta = model_class._meta
        if meta.app_label not in ("catalog", "router"):
            continue
        yield reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        obj = rows.get(meta.model_name)
        if obj is not None:
            yield reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[obj.pk])
            yield reverse(f"admin:{meta.app_label}_{meta.model_name}_history", args=[obj.pk])


def test_every_admin_page_loads_for_staff(client, admin_user, catalog_rows):
    client.force_login(admin_user)
    urls = list(admin_urls(catalog_rows))
    assert len(urls) >= 7 * 3 - 3  # every catalog model registered
    for url in urls:
        assert client.get(url).status_code == 200, url


def test_admin_is_refused_to_anonymous_and_non_staff(client, viewer, catalog_rows):
    for url in admin_urls(catalog_rows):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"], url
    client.force_login(viewer)
    for url in admin_urls(catalog_rows):
        assert client.get(url).status_code == 302, url


def test_a_declared_model_cannot_be_edited_or_deleted(client, admin_user, catalog_rows):
    client.force_login(admin_user)
    declared = catalog_rows["declared"]
    url = reverse("admin:catalog_model_change", args=[declared.pk])
    page = client.get(url).content.decode()
    assert 'name="name"' not in page  # shown, not as a form
    client.post(url, {"name": "renamed", "source": "x"})
    declared.refresh_from_db()
    assert declared.name == "decl"
    assert client.post(reverse("admin:catalog_model_delete", args=[declared.pk]), {"post": "yes"}).status_code == 403
    assert Model.objects.filter(pk=declared.pk).exists()
    profile = declared.profiles.get()
    client.post(reverse("admin:catalog_profile_change", args=[profile.pk]), {"name": "x", "engine": "vllm", "args": "[]"})
    profile.refresh_from_db()
    assert profile.name == "v"


def test_change_history_is_read_only(client, admin_user, catalog_rows):
    client.force_login(admin_user)
    change = catalog_rows["change"]
    assert client.get(reverse("admin:catalog_change_add")).status_code == 403
    client.post(reverse("admin:catalog_change_change", args=[change.pk]), {"state": "failed", "message": "x"})
    change.refresh_from_db()
    assert change.state == "succeeded"
    assert client.post(reverse("admin:catalog_change_delete", args=[change.pk]), {"post": "yes"}).status_code == 403


def test_profile_form_refuses_a_context_flag_change(client, admin_user, catalog_rows):
    client.force_login(admin_user)
    profile = catalog_rows["profile"]
    data = {"model": profile.model.pk, "name": "gpu", "engine": "llamacpp", "gpu_class": profile.gpu_class.pk,
            "gpus_per_node": 1, "tp": 1, "pp": 1, "nodes": 1, "min_memory_gb": 0}
    url = reverse("admin:catalog_profile_change", args=[profile.pk])
    response = client.post(url, {**data, "args": '["--ctx-size", "8192", "--parallel", "1"]'})
    assert response.status_code == 200
    assert "is the context" in response.content.decode()
    profile.refresh_from_db()
    assert profile.args == ["--ctx-size", "4096", "--parallel", "1"]
    # other flags may change
    response = client.post(url, {**data, "args": '["--ctx-size", "4096", "--parallel", "1", "--threads", "4"]'})
    assert response.status_code == 302
    profile.refresh_from_db()
    assert profile.args[-2:] == ["--threads", "4"]


def test_gpu_classes_are_seeded_with_sources(db):
    names = set(GPUClass.objects.values_list("name", flat=True))
    assert {"L4", "A10G", "L40S", "A100-40G", "A100-80G", "H100-80G", "H200", "B200", "RTX-4090", "MI300X"} <= names
    for g in GPUClass.objects.all():
        assert 0 < g.usable_gb <= g.memory_gb and g.source
