"""Catalog rows and a model shape for the services, API and CLI tests."""

from __future__ import annotations

from catalog.domain.shape import Shape
from catalog.models import GPUClass, Model, Node, OriginFile, Profile, Replica

GiB = 1 << 30

# A Llama-like 8B: 32 layers, 8 KV heads of 128: 128 KiB of f16 KV a token; 16 GiB of weights.
LLAMA_8B = Shape(
    architecture="llama",
    layers=32,
    heads=32,
    kv_heads=8,
    trained_context=32768,
    head_k=128,
    head_v=128,
    weights_bytes=16 * GiB,
    source_kind="gguf",
)


def use_shape(monkeypatch, shape: Shape | None = LLAMA_8B, note: str = "") -> None:
    """Every model's shape is `shape` (reading a real one is catalog.shapes' test's job)."""
    monkeypatch.setattr("catalog.services._shape_of", lambda model: (shape, note))


# As the migration seeds them; a transactional test's flush removes seeded rows.
GPUS = {"A100-80G": (79.15, 78.6), "L4": (22.49, 22.0)}


def gpu_class(name: str) -> GPUClass:
    memory, usable = GPUS[name]
    return GPUClass.objects.get_or_create(name=name, defaults={"memory_gb": memory, "usable_gb": usable, "source": "test"})[0]


def make_node(name: str = "gpu-1", gpu: str = "A100-80G", count: int = 8, ram_gb: int = 512) -> Node:
    return Node.objects.get_or_create(
        name=name, defaults={"gpu_class": gpu_class(gpu), "gpu_count": count, "ram_gb": ram_gb}
    )[0]


def make_model(
    name: str = "llama-8b",
    *,
    context: int = 8192,
    max_output: int = 2048,
    declared: bool = False,
    replicas: int = 1,
) -> Model:
    """A model served three ways: llama.cpp on an A100-80G, vLLM on two, llama.cpp on CPUs."""
    model = Model.objects.create(
        name=name,
        source=f"https://mirror.example/{name}.gguf",
        origin_repo=f"example/{name}",
        context_length=context,
        max_output=max_output,
        declared=declared,
    )
    OriginFile.objects.create(model=model, path="model.safetensors", size=16 * GiB)
    a100 = gpu_class("A100-80G")
    node = make_node()
    cpu_node = make_node("cpu-1", gpu="L4", count=0)
    gguf = Profile.objects.create(
        model=model,
        name="gguf",
        engine="llamacpp",
        args=["-m", f"/models/{name}.gguf", "--ctx-size", str(context * 2), "--parallel", "2"],
        gpu_class=a100,
        gpus_per_node=1,
    )
    vllm = Profile.objects.create(
        model=model,
        name="vllm",
        engine="vllm",
        args=[f"--max-model-len={context}", "--gpu-memory-utilization", "0.9"],
        gpu_class=a100,
        gpus_per_node=2,
        tp=2,
    )
    cpu = Profile.objects.create(
        model=model,
        name="cpu",
        engine="llamacpp",
        args=["--ctx-size", str(context), "--parallel", "1"],
        cpu_only=True,
        min_memory_gb=20,
    )
    for profile, on in ((gguf, node), (vllm, node), (cpu, cpu_node)):
        for slot in range(replicas):
            Replica.objects.create(
                profile=profile,
                node=on,
                slot=slot,
                state="ready",
                endpoint=f"http://127.0.0.1:{18000 + profile.pk * 10 + slot}",
                args=profile.args,
            )
    return model
