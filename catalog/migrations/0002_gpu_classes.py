"""Seed the GPU classes. memory_gb is what the driver reports as the card's total
(nvidia-smi / rocm-smi "total", in GiB); usable_gb is that less the ~0.5 GiB the
CUDA/ROCm context and driver take on every card before an engine allocates anything
(vLLM's "non-torch memory", vllm/v1/worker/gpu_worker.py). Editable in admin."""

from django.db import migrations

GPU_CLASSES = [
    # name, memory GiB, usable GiB, source
    ("L4", 22.49, 22.0, "NVIDIA L4 datasheet: 24 GB GDDR6; nvidia-smi total 23034 MiB"),
    ("A10G", 22.49, 22.0, "AWS G5 (NVIDIA A10G): 24 GB GDDR6; nvidia-smi total 23028 MiB"),
    ("L40S", 44.99, 44.5, "NVIDIA L40S datasheet: 48 GB GDDR6 ECC; nvidia-smi total 46068 MiB"),
    ("A100-40G", 39.59, 39.1, "NVIDIA A100 datasheet: 40 GB HBM2; nvidia-smi total 40536 MiB (SXM4)"),
    ("A100-80G", 79.15, 78.6, "NVIDIA A100 datasheet: 80 GB HBM2e; nvidia-smi total 81051 MiB (SXM4)"),
    ("H100-80G", 79.65, 79.1, "NVIDIA H100 datasheet: 80 GB HBM3 (SXM5); nvidia-smi total 81559 MiB"),
    ("H200", 140.4, 139.9, "NVIDIA H200 datasheet: 141 GB HBM3e; nvidia-smi total 143771 MiB"),
    ("B200", 179.06, 178.5, "NVIDIA DGX B200 datasheet: 180 GB HBM3e per GPU; nvidia-smi total 183359 MiB"),
    ("RTX-4090", 23.99, 23.5, "NVIDIA GeForce RTX 4090 spec: 24 GB GDDR6X; nvidia-smi total 24564 MiB"),
    ("MI300X", 191.98, 191.5, "AMD Instinct MI300X datasheet: 192 GB HBM3; rocm-smi VRAM total 196592 MiB"),
]


def seed(apps, schema_editor):
    GPUClass = apps.get_model("catalog", "GPUClass")
    for name, memory, usable, source in GPU_CLASSES:
        GPUClass.objects.update_or_create(name=name, defaults={"memory_gb": memory, "usable_gb": usable, "source": source})


def unseed(apps, schema_editor):
    apps.get_model("catalog", "GPUClass").objects.filter(name__in=[g[0] for g in GPU_CLASSES]).delete()


class Migration(migrations.Migration):
    dependencies = [("catalog", "0001_initial")]
    operations = [migrations.RunPython(seed, unseed)]
