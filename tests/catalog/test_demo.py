"""`manage.py demo`: a realistic catalog that works offline, harmless to run twice."""

from io import StringIO

import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command

from catalog import shapes
from catalog.models import Model, Node, Profile


@pytest.fixture
def demo_env(tmp_path, settings, monkeypatch):
    from huggingface_hub import constants

    settings.LLMGW_MIRROR_ROOT = tmp_path / "mirror"
    settings.DATA_DIR = tmp_path
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


@pytest.mark.django_db
def test_demo_fills_the_catalog_and_twice_is_harmless(demo_env):
    out = StringIO()
    call_command("demo", stdout=out)
    text = out.getvalue()
    password = text.split("password '")[1].split("'")[0]
    assert authenticate(username="admin", password=password).is_superuser

    profiles = Profile.objects.select_related("gpu_class", "model")
    assert {p.engine for p in profiles} == {"llamacpp", "vllm", "sglang", "strata", "freetoken"}
    assert any(p.cpu_only for p in profiles)
    assert len({p.gpu_class.name for p in profiles if p.gpu_class}) >= 3
    assert Node.objects.count() >= 3
    assert Model.objects.get(name="mistral-7b-instruct").declared

    # the small GGUF, the 128k-vocabulary header and the HF config are all readable offline
    tiny, big, hf = (Model.objects.get(name=n) for n in ("tiny-llama", "llama-3.1-8b-q4", "qwen2.5-7b-instruct"))
    for model in (tiny, big, hf):
        shape, note = shapes.shape_of(model)
        assert shape is not None and note == "", (model.name, note)
    big.refresh_from_db()
    big_shape, _ = shapes.shape_of(big)
    assert big_shape.trained_context == 131072 and big_shape.kv_heads == 8
    header = (demo_env / "mirror" / big.source)
    from catalog.domain.gguf import read_header

    read = read_header(str(header))
    assert 7_000_000 < read.header_bytes < 9_000_000  # as large as Llama-3's (7.8 MB)
    assert read.file_size > 4 << 30 and header.stat().st_blocks * 512 < 64 << 20  # real size, sparse on disk
    assert shapes.shape_of(hf)[0].kv_heads == 4

    before = (Model.objects.count(), Profile.objects.count(), Node.objects.count())
    out = StringIO()
    call_command("demo", stdout=out)
    assert (Model.objects.count(), Profile.objects.count(), Node.objects.count()) == before
    assert f"password '{password}'" in out.getvalue()
    assert "already in the catalog" in out.getvalue()
