"""The machine signature: what the last bits of a computation depend on, besides the build.

Loads, saves, copies and format conversions move bytes and give the same bits on every
machine. Anything computed (a training step, a reduction) may not: CPUs of one architecture
run other kernels (vector width, the BLAS library's code path for the CPU, how a reduction
is split over threads), so one torch build can train to other last bits on another runner.
A record of computed values (a golden set's trajectory) names the signature it was made on;
a reader holds those values bit for bit only where its own signature is the same, and within
a stated tolerance elsewhere. Reports name the signature beside the torch build, so that a
user who sees a difference can tell the machine from the build.

The signature is taken in the process that computes: a rank's intra-op threads are the
harness's (``RANK_THREADS``, unless ``OMP_NUM_THREADS`` says otherwise), not the
controller's.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Final

from harness.devices import CPU

# Intra-op threads of a rank process unless OMP_NUM_THREADS is set: a small machine's ranks
# must not oversubscribe its cores.
RANK_THREADS: Final = "1"
_CPUINFO: Final = Path("/proc/cpuinfo")
_BLAS_FIELDS: Final = ("BLAS_INFO", "LAPACK_INFO")
# Variables that choose other kernels in a build's libraries (MKL's instruction set and
# reproducibility mode, oneDNN's instruction set), as ATEN_CPU_CAPABILITY does in ATen's.
KERNEL_SETTINGS: Final = (
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_CBWR",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
)


@dataclass(frozen=True)
class MachineSignature:
    """Facts of a machine and process that decide which kernels run, and so which bits come
    out: equal signatures and an equal torch build compute equal bits."""

    arch: str  # platform.machine(): x86_64, aarch64
    cpu: str  # the CPU's model name
    cpu_id: str  # vendor, family, model and stepping, where the CPU reports them
    cpu_flags: str  # a digest of the CPU's feature flags (what a hypervisor passes through)
    capability: str  # ATen's CPU capability in use (ATEN_CPU_CAPABILITY lowers it)
    blas: str  # the BLAS and LAPACK the build calls, and their versions where it says
    intra_op_threads: int  # torch's intra-op threads in the computing process
    libc: str  # the C library and its version
    accelerator: str | None = None  # the device computed on, where it is not the CPU
    settings: str = ""  # the KERNEL_SETTINGS set in the environment, NAME=value each

    def describe(self) -> str:
        """One line for reports and messages."""
        parts = [
            f"{self.cpu} ({self.cpu_id}, flags {self.cpu_flags})",
            f"{self.arch} {self.capability}",
            self.blas,
            f"{self.intra_op_threads} intra-op thread{'s' * (self.intra_op_threads != 1)}",
            self.libc,
        ]
        if self.accelerator:
            parts.insert(0, self.accelerator)
        if self.settings:
            parts.append(self.settings)
        return ", ".join(parts)

    def differences(self, other: MachineSignature) -> list[str]:
        """Each fact in which ``other`` differs from this signature, as ``name: this vs
        other``."""
        return [
            f"{field.name}: {getattr(self, field.name)!r} vs {getattr(other, field.name)!r}"
            for field in fields(self)
            if getattr(self, field.name) != getattr(other, field.name)
        ]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MachineSignature:
        known = {field.name for field in fields(cls)}
        return cls(**{name: value for name, value in data.items() if name in known})


def this_machine(device_type: str = CPU, threads: int | None = None) -> MachineSignature:
    """The signature of this process computing on ``device_type`` with ``threads`` intra-op
    threads (default: torch's own count in this process). Imports torch."""
    import torch

    return MachineSignature(
        arch=platform.machine(),
        cpu=_cpuinfo_field("model name") or platform.processor() or platform.machine(),
        cpu_id=_cpu_id(),
        cpu_flags=_flags_digest(),
        capability=str(torch.backends.cpu.get_cpu_capability()),
        blas=_blas(torch.__config__.show()),
        intra_op_threads=torch.get_num_threads() if threads is None else threads,
        libc=" ".join(part for part in platform.libc_ver() if part) or "unknown",
        accelerator=None if device_type == CPU else _accelerator(device_type),
        settings=", ".join(
            f"{name}={os.environ[name]}" for name in KERNEL_SETTINGS if name in os.environ
        ),
    )


def rank_threads() -> int:
    """The intra-op threads a rank process of the harness runs with, read in the controller:
    ``OMP_NUM_THREADS`` where it is set, else ``RANK_THREADS``."""
    value = os.environ.get("OMP_NUM_THREADS") or RANK_THREADS
    return int(value) if value.isdigit() and int(value) > 0 else int(RANK_THREADS)


def _cpuinfo_lines() -> list[str]:
    try:
        text = _CPUINFO.read_text()
    except OSError:
        return []
    return text.split("\n\n", 1)[0].splitlines()  # the first processor's block


def _cpuinfo_field(name: str) -> str | None:
    for line in _cpuinfo_lines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def _cpu_id() -> str:
    names = ("vendor_id", "cpu family", "model", "stepping", "CPU implementer", "CPU part")
    found = [f"{name} {value}" for name in names if (value := _cpuinfo_field(name)) is not None]
    return ", ".join(found) or "unknown"


def _flags_digest() -> str:
    flags = _cpuinfo_field("flags") or _cpuinfo_field("Features") or ""
    return hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:12]


def _blas(config: str) -> str:
    """The build's BLAS and LAPACK (``BLAS_INFO``, ``LAPACK_INFO``) and MKL's version where it
    links MKL, from its configuration (``torch.__config__.show()``)."""
    found = []
    for name in _BLAS_FIELDS:
        match = re.search(rf"{name}=([^,\s]+)", config)
        found.append(f"{name.split('_')[0].lower()} {match.group(1) if match else 'none'}")
    mkl = re.search(r"Math Kernel Library Version (\d[\d.]*)", config)
    if mkl:
        found.append(f"MKL {mkl.group(1)}")
    return ", ".join(found)


def _accelerator(device_type: str) -> str:
    import torch

    module = torch.get_device_module(device_type)
    name = getattr(module, "get_device_name", None)
    device = str(name()) if callable(name) else device_type
    runtime = getattr(torch.version, device_type, None)
    if device_type == "cuda" and not runtime:
        runtime = torch.version.hip  # a ROCm build names its devices cuda
    return f"{device} ({device_type} {runtime})" if runtime else f"{device} ({device_type})"
