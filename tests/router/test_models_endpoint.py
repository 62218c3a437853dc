"""GET /v1/models: OpenAI's list shape, with the context and longest answer served."""

from router.models import ApiKey


def test_lists_every_model_with_context_and_max_output(router, auth, make_model):
    make_model("beta", context_length=8192, max_output=2048)
    make_model("alpha", context_length=4096, max_output=0)
    r = router.get("/v1/models", headers=auth)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["alpha", "beta"]
    beta = body["data"][1]
    assert beta["object"] == "model" and beta["owned_by"] and isinstance(beta["created"], int)
    assert (beta["context_length"], beta["max_output"]) == (8192, 2048)
    assert (body["data"][0]["context_length"], body["data"][0]["max_output"]) == (4096, 0)


def test_shows_the_current_values(router, auth, make_model):
    from catalog.models import Model

    make_model("m", context_length=4096, max_output=1024)
    Model.objects.filter(name="m").update(context_length=16384, max_output=4096)
    (entry,) = router.get("/v1/models", headers=auth).json()["data"]
    assert (entry["context_length"], entry["max_output"]) == (16384, 4096)


def test_a_limited_key_sees_only_its_models(router, make_model):
    allowed, _ = make_model("allowed")
    make_model("other")
    row, key = ApiKey.issue("limited")
    row.models.set([allowed])
    r = router.get("/v1/models", headers={"authorization": f"Bearer {key}"})
    assert [m["id"] for m in r.json()["data"]] == ["allowed"]


def test_needs_a_key(router, make_model):
    make_model("m")
    r = router.get("/v1/models")
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "missing_api_key"
