"""catalog.shapes: a model's shape read once, cached on its row, read again when what it was read
from changes, and the seed's notes when the memory cannot be checked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from werkzeug import Request, Response

from catalog.models import Model, OriginFile
from catalog.shapes import refresh_shape, shape_of
from tests.llamacpp.ggufs import write_gemma2, write_llama

pytestmark = pytest.mark.django_db

NOTE_TAIL = ", so the memory it needs is not checked"


def serve_with_ranges(httpserver, url_path: str, data: bytes) -> str:
    """Serve bytes the way a mirror does: GET with Range -> 206 + Content-Range."""

    def handler(request: Request) -> Response:
        rng = request.headers.get("Range")
        if not rng:
            return Response(data, 200, headers={"Accept-Ranges": "bytes"})
        m = re.match(r"bytes=(\d+)-(\d*)", rng)
        start = int(m.group(1))
        end = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
        if start >= len(data):
            return Response(b"", 416, headers={"Content-Range": f"bytes */{len(data)}"})
        return Response(data[start:end + 1], 206, headers={
            "Content-Range": f"bytes {start}-{end}/{len(data)}", "Accept-Ranges": "bytes"})

    httpserver.expect_request(url_path).respond_with_handler(handler)
    return httpserver.url_for(url_path)


@pytest.fixture
def mirror(tmp_path, settings):
    root = tmp_path / "mirror"
    root.mkdir()
    settings.LLMGW_MIRROR_ROOT = root
    settings.LLMGW_SHAPE_TIMEOUT = 5.0
    return root


def fresh(model: Model) -> Model:
    return Model.objects.get(pk=model.pk)


def test_gguf_over_http_read_once(mirror, httpserver, tmp_path):
    data = write_llama(tmp_path / "a.gguf").read_bytes()
    url = serve_with_ranges(httpserver, "/models/a.gguf", data)
    m = Model.objects.create(name="tiny", source=url)

    shape, note = shape_of(m)
    assert note == ""
    assert shape.architecture == "llama" and shape.kv_heads == 2 and shape.layers == 2
    assert shape.weights_bytes == len(data)  # the GGUF's own size (Content-Range total)
    first = len(httpserver.log)
    assert first >= 1

    row = fresh(m)
    assert row.shape["architecture"] == "llama" and row.shape_error == "" and row.shape_read_at is not None
    assert json.loads(row.shape_key)["source"] == url

    again, note2 = shape_of(row)  # a new instance, from the database: no I/O at all
    assert again == shape and note2 == ""
    assert len(httpserver.log) == first


def test_reread_when_source_changes(mirror, httpserver, tmp_path):
    url_a = serve_with_ranges(httpserver, "/a.gguf", write_llama(tmp_path / "a.gguf").read_bytes())
    url_b = serve_with_ranges(httpserver, "/b.gguf", write_gemma2(tmp_path / "b.gguf").read_bytes())
    m = Model.objects.create(name="swap", source=url_a)
    assert shape_of(m)[0].architecture == "llama"
    n = len(httpserver.log)
    Model.objects.filter(pk=m.pk).update(source=url_b)
    shape, _ = shape_of(fresh(m))
    assert shape.architecture == "gemma2" and shape.sliding_window == 64
    assert len(httpserver.log) > n
    assert fresh(m).shape["architecture"] == "gemma2"


def test_refresh_forces_a_read(mirror, httpserver, tmp_path):
    url = serve_with_ranges(httpserver, "/a.gguf", write_llama(tmp_path / "a.gguf").read_bytes())
    m = Model.objects.create(name="r", source=url)
    shape_of(m)
    n = len(httpserver.log)
    shape, note = refresh_shape(fresh(m))
    assert shape.architecture == "llama" and note == "" and len(httpserver.log) > n


def test_local_relative_path_and_change_of_file(mirror):
    (mirror / "sub").mkdir()
    path = write_llama(mirror / "sub" / "x.gguf")
    m = Model.objects.create(name="local", source="sub/x.gguf")
    shape, note = shape_of(m)
    assert note == "" and shape.weights_bytes == path.stat().st_size
    # the file is replaced: its size/mtime are part of the key, so it is read again
    write_gemma2(path)
    shape2, _ = shape_of(fresh(m))
    assert shape2.architecture == "gemma2"


def test_split_gguf_weights_sum_all_shards(mirror):
    # shard 1 carries the metadata; shard 2 only has to be there (its size counts)
    first = mirror / "big-00001-of-00002.gguf"
    write_llama(first)
    data = first.read_bytes()
    second = mirror / "big-00002-of-00002.gguf"
    second.write_bytes(b"\0" * 12345)
    m = Model.objects.create(name="split", source=str(first))
    shape, note = shape_of(m)
    assert note == "" and shape.weights_bytes == len(data) + 12345


def test_path_outside_the_mirror_is_refused(mirror, tmp_path):
    outside = write_llama(tmp_path / "elsewhere.gguf")
    for source in (str(outside), "../elsewhere.gguf"):
        m, _ = Model.objects.update_or_create(name="escape", defaults={"source": source})
        shape, note = refresh_shape(m)
        assert shape is None
        assert note.startswith("its header could not be read (") and "outside the mirror root" in note
        assert note.endswith(NOTE_TAIL)


def test_unreadable_header_note(mirror):
    (mirror / "junk.gguf").write_bytes(b"NOTGGUF" + b"\0" * 100)
    m = Model.objects.create(name="junk", source="junk.gguf")
    shape, note = shape_of(m)
    assert shape is None
    assert re.fullmatch(r"its header could not be read \(.+\), so the memory it needs is not checked", note)
    row = fresh(m)
    assert row.shape is None and row.shape_error.startswith("header: ")
    # cached: the same note without reading again
    assert shape_of(row) == (None, note)


def test_missing_file_note(mirror):
    m = Model.objects.create(name="gone", source="nowhere.gguf")
    shape, note = shape_of(m)
    assert shape is None and note.startswith("its header could not be read (") and note.endswith(NOTE_TAIL)


def test_bad_metadata_note(mirror):
    from gguf import GGUFWriter

    w = GGUFWriter(str(mirror / "nolayers.gguf"), "llama")
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = Model.objects.create(name="nolayers", source="nolayers.gguf")
    shape, note = shape_of(m)
    assert shape is None and "block_count" in note and note.endswith(NOTE_TAIL)


def test_unknown_origin_note(mirror):
    m = Model.objects.create(name="orphan")
    assert shape_of(m) == (None, "where it came from is not known, so the memory it needs is not checked")
    m2 = Model.objects.create(name="notgguf", source="https://mirror/x.safetensors")
    assert shape_of(m2)[1] == "where it came from is not known, so the memory it needs is not checked"


@pytest.fixture
def hub(httpserver, tmp_path, monkeypatch):
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", httpserver.url_for("").rstrip("/"))

    def serve(repo, config, siblings):
        body = json.dumps(config).encode()
        headers = {"ETag": f'"e{len(body)}"', "X-Repo-Commit": "b" * 40}
        url = f"/{repo}/resolve/main/config.json"
        httpserver.expect_request(url, method="HEAD").respond_with_data(body, headers=headers)
        httpserver.expect_request(url, method="GET").respond_with_data(body, headers=headers)
        httpserver.expect_request(f"/api/models/{repo}").respond_with_json(
            {"id": repo, "sha": "b" * 40, "siblings": [{"rfilename": n, "size": z} for n, z in siblings]})

    serve.server = httpserver
    return serve


QWEN3 = {"model_type": "qwen3", "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 64,
         "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960, "torch_dtype": "bfloat16"}


def test_hf_origin_with_origin_files(mirror, hub, httpserver):
    hub("Qwen/Qwen3-32B", QWEN3, [("model-1.safetensors", 999)])
    m = Model.objects.create(name="q", origin_repo="Qwen/Qwen3-32B")
    OriginFile.objects.create(model=m, path="model-1.safetensors", size=60_000)
    OriginFile.objects.create(model=m, path="model-2.safetensors", size=5_000)
    shape, note = shape_of(m)
    assert note == "" and shape.kv_per_token == 262144 and shape.weights_bytes == 65_000
    n = len(httpserver.log)
    assert shape_of(fresh(m))[0] == shape and len(httpserver.log) == n
    # the origin's files change: read again
    OriginFile.objects.create(model=m, path="model-3.safetensors", size=1)
    assert shape_of(fresh(m))[0].weights_bytes == 65_001 and len(httpserver.log) > n


def test_hf_origin_sizes_from_the_hub(mirror, hub):
    hub("Qwen/Qwen3-32B", QWEN3, [("model-1.safetensors", 999), ("model-2.safetensors", 1)])
    m = Model.objects.create(name="q2", origin_repo="Qwen/Qwen3-32B")
    shape, note = shape_of(m)
    assert note == "" and shape.weights_bytes == 1000


def test_unknown_sizes_note(mirror, hub):
    hub("org/nosizes", QWEN3, [("config.json", 10)])
    m = Model.objects.create(name="nosizes", origin_repo="org/nosizes")
    shape, note = shape_of(m)
    assert shape is not None and shape.trained_context == 40960  # partial: the shape is known
    assert note == "its files' sizes are not known, so the memory it needs is not checked"
    assert shape_of(fresh(m)) == (shape, note)  # and so is the cached answer


def test_config_unreadable_note(mirror, hub, httpserver):
    httpserver.expect_request("/org/missing/resolve/main/config.json").respond_with_data(
        "not found", status=404, headers={"X-Error-Code": "EntryNotFound"})
    m = Model.objects.create(name="cfg", origin_repo="org/missing")
    shape, note = shape_of(m)
    assert shape is None
    assert note.startswith("its config could not be read (org/missing") and note.endswith(NOTE_TAIL)
    assert fresh(m).shape_error.startswith("config: ")


def test_failed_read_is_retried_after_ttl(mirror, settings):
    settings.LLMGW_SHAPE_ERROR_TTL = 0
    m = Model.objects.create(name="later", source="later.gguf")
    assert shape_of(m)[0] is None
    write_llama(mirror / "later.gguf")
    # the key changed anyway (the file now exists); with a TTL of 0 even the same key is re-read
    assert shape_of(fresh(m))[0].architecture == "llama"


def test_unsaved_model_is_not_stored(mirror):
    write_llama(mirror / "u.gguf")
    m = Model(name="unsaved", source="u.gguf")
    shape, note = shape_of(m)
    assert shape.architecture == "llama" and not Model.objects.filter(name="unsaved").exists()


def test_never_raises_on_odd_rows(mirror):
    m = Model.objects.create(name="odd", source="x.gguf")
    Model.objects.filter(pk=m.pk).update(shape={"nonsense": 1}, shape_key="stale")
    shape, note = shape_of(fresh(m))
    assert shape is None and note.endswith(NOTE_TAIL)
    assert Path(str(mirror)).exists()
